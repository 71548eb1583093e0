package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// recordedCustody is a store whose key_custody row is rec (none when URI
// is empty).
type recordedCustody struct{ rec store.KeyCustody }

func (r recordedCustody) GetKeyCustody(context.Context) (store.KeyCustody, error) {
	if r.rec.URI == "" {
		return store.KeyCustody{}, store.ErrNotFound
	}
	return r.rec, nil
}

func (r recordedCustody) RecordKeyCustody(context.Context, store.KeyCustody) (store.KeyCustody, error) {
	panic("not used")
}

func (r recordedCustody) ClearKeyCustody(context.Context, string) error { panic("not used") }

// TestStoreCustody: the token the store records (muster ca
// migrate-custody) binds every replica: one whose authority.json does not
// name it starts only with --pkcs11-module (and the pkcs11 build), and the
// refusal names what it needs; without a record authority.json decides.
func TestStoreCustody(t *testing.T) {
	ctx := context.Background()
	rec := store.KeyCustody{URI: "pkcs11:token=muster", Module: "/usr/lib/softhsm/libsofthsm2.so", RecordedAt: time.Unix(1e9, 0)}
	local := &datadir.Custody{URI: "pkcs11:token=muster", Module: "/opt/hsm.so", PINFile: "/etc/pin"}

	if got, err := storeCustody(ctx, recordedCustody{}, nil, ""); err != nil || got != nil {
		t.Errorf("no record, sealed authority.json: %+v %v; want sealed", got, err)
	}
	if got, err := storeCustody(ctx, recordedCustody{}, local, ""); err != nil || got != local {
		t.Errorf("no record, init --custody: %+v %v; want authority.json's", got, err)
	}
	if got, err := storeCustody(ctx, recordedCustody{rec}, local, ""); err != nil || got != local {
		t.Errorf("recorded and named by authority.json: %+v %v; want authority.json's", got, err)
	}
	other := &datadir.Custody{URI: "pkcs11:token=other", Module: "/opt/hsm.so"}
	if _, err := storeCustody(ctx, recordedCustody{rec}, other, ""); err == nil || !strings.Contains(err.Error(), "pkcs11:token=other") {
		t.Errorf("authority.json names another token: %v", err)
	}
	_, err := storeCustody(ctx, recordedCustody{rec}, nil, "")
	want := []string{rec.URI, "--pkcs11-module PATH", rec.Module, "--pkcs11-pin-file", "MUSTER_PKCS11_PIN"}
	if !custody.PKCS11Build {
		want = append(want, "muster-pkcs11")
	}
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("a replica without the token's module: %v; want it to name %q", err, w)
		}
	}
	got, err := storeCustody(ctx, recordedCustody{rec}, nil, "/opt/hsm.so")
	if custody.PKCS11Build {
		if err != nil || got == nil || got.URI != rec.URI || got.Module != "/opt/hsm.so" {
			t.Errorf("a replica given the module: %+v %v; want the store's token with that module", got, err)
		}
	} else if err == nil || !strings.Contains(err.Error(), "muster-pkcs11") {
		t.Errorf("the static build given a module: %v; want it to name the pkcs11 build", err)
	}
}

// TestMigrateCustodyKeepsAPINOutOfTheAudit: a --custody URI carrying a PIN
// (pin-value) is refused, and neither the refusal nor its audit record
// repeats the PIN.
func TestMigrateCustodyKeepsAPINOutOfTheAudit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if code, _, stderr := runCLI(t, "init", "--data", dir); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	const pin = "s3cret-4711"
	code, stdout, stderr := runCLI(t, "ca", "migrate-custody", "--data", dir, "--custody", "pkcs11:token=muster?pin-value="+pin)
	if code == 0 || !strings.Contains(stderr, "pin-value") {
		t.Fatalf("a PIN in the URI: exit %d, %q; want it refused", code, stderr)
	}
	if strings.Contains(stdout+stderr, pin) {
		t.Errorf("the refusal repeats the PIN: %q", stdout+stderr)
	}
	st, err := sqlite.Open(context.Background(), datadir.Dir(dir).DatabaseFile())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.ListAudit(context.Background(), store.AuditFilter{Action: "ca.migrate_custody"})
	if err != nil || len(recs) == 0 {
		t.Fatalf("the refusal is not audited: %v %v", recs, err)
	}
	if all := fmt.Sprintf("%+v", recs); strings.Contains(all, pin) {
		t.Errorf("the audit record holds the PIN: %s", all)
	}
}
