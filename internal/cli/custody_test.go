package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// recordedCustody is a store whose key_custody row is rec (none when URI
// is empty), with its intermediates and signers.
type recordedCustody struct {
	rec     store.KeyCustody
	cas     []store.CACert
	signers []store.Signer
}

func (r recordedCustody) ListCACerts(context.Context) ([]store.CACert, error) { return r.cas, nil }

func (r recordedCustody) ListSigners(context.Context) ([]store.Signer, store.SignerSetID, error) {
	return r.signers, store.SignerSetID{}, nil
}

func (r recordedCustody) GetKeyCustody(context.Context) (store.KeyCustody, error) {
	if r.rec.URI == "" {
		return store.KeyCustody{}, store.ErrNotFound
	}
	return r.rec, nil
}

func (r recordedCustody) RecordKeyCustody(context.Context, store.KeyCustody, func(store.AuditHead) (store.AuditRecord, error)) (store.KeyCustody, error) {
	panic("not used")
}

func (r recordedCustody) ClearKeyCustody(context.Context, string, func(store.AuditHead) (store.AuditRecord, error)) error {
	panic("not used")
}

// TestStoreCustody: the token the store records (muster ca
// migrate-custody) binds every replica: one whose authority.json does not
// name it starts only with --pkcs11-module (and the pkcs11 build), and the
// refusal names what it needs; without a record authority.json decides.
func TestStoreCustody(t *testing.T) {
	ctx := context.Background()
	dir := datadir.Dir("/var/lib/muster/authority")
	rec := store.KeyCustody{URI: "pkcs11:token=muster", Module: "/usr/lib/softhsm/libsofthsm2.so", RecordedAt: time.Unix(1e9, 0)}
	local := &datadir.Custody{URI: "pkcs11:token=muster", Module: "/opt/hsm.so", PINFile: "/etc/pin"}

	if got, err := storeCustody(ctx, recordedCustody{}, offlineDir{dir: dir}, nil, ""); err != nil || got != nil {
		t.Errorf("no record, sealed authority.json: %+v %v; want sealed", got, err)
	}
	inToken := recordedCustody{
		cas:     []store.CACert{{Role: "agent", Serial: "a1", State: store.CAActive, KeyRef: []byte("pkcs11:token=muster;object=muster-ca%2Fagent%2Fa1;id=%01")}},
		signers: []store.Signer{{VersionID: "v1", State: store.SignerActive, KeyRef: []byte("pkcs11:token=muster;object=muster-signer%2Fv1;id=%02")}},
	}
	if got, err := storeCustody(ctx, inToken, offlineDir{dir: dir}, local, ""); err != nil || got != local {
		t.Errorf("no record, init --custody: %+v %v; want authority.json's", got, err)
	}
	if got, err := storeCustody(ctx, recordedCustody{rec: rec}, offlineDir{dir: dir}, local, ""); err != nil || got != local {
		t.Errorf("recorded and named by authority.json: %+v %v; want authority.json's", got, err)
	}
	other := &datadir.Custody{URI: "pkcs11:token=other", Module: "/opt/hsm.so"}
	if _, err := storeCustody(ctx, recordedCustody{rec: rec}, offlineDir{dir: dir}, other, ""); err == nil || !strings.Contains(err.Error(), "pkcs11:token=other") {
		t.Errorf("authority.json names another token: %v", err)
	}
	_, err := storeCustody(ctx, recordedCustody{rec: rec}, offlineDir{dir: dir}, nil, "")
	want := []string{rec.URI, "--pkcs11-module PATH", rec.Module, "--pkcs11-pin-file", "MUSTER_PKCS11_PIN",
		"muster-pkcs11 ca migrate-custody --data " + string(dir) + " --custody '" + rec.URI + "'"}
	if !custody.PKCS11Build {
		want = append(want, "muster-pkcs11")
	}
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("a replica without the token's module: %v; want it to name %q", err, w)
		}
	}
	got, err := storeCustody(ctx, recordedCustody{rec: rec}, offlineDir{dir: dir}, nil, "/opt/hsm.so")
	if custody.PKCS11Build {
		if err != nil || got == nil || got.URI != rec.URI || got.Module != "/opt/hsm.so" {
			t.Errorf("a replica given the module: %+v %v; want the store's token with that module", got, err)
		}
	} else if err == nil || !strings.Contains(err.Error(), "muster-pkcs11") {
		t.Errorf("the static build given a module: %v; want it to name the pkcs11 build", err)
	}
}

// TestStoreCustodyOutOfStep: authority.json names a token the store does
// not record while the store signs with a sealed key (a store restored
// from before muster ca migrate-custody): refused, naming the key and the
// two ways out from the data directory; a store whose keys in use are all
// in the token (muster init --custody records no migration) starts.
func TestStoreCustodyOutOfStep(t *testing.T) {
	ctx := context.Background()
	dir := datadir.Dir("/var/lib/muster/authority")
	local := &datadir.Custody{URI: "pkcs11:token=muster", Module: "/opt/hsm.so", PINFile: "/etc/pin"}
	tokenRef := func(name string) []byte { return []byte("pkcs11:token=muster;object=" + name + ";id=%01") }
	sealedCA := store.CACert{Role: "server", Serial: "5e", State: store.CAActive, KeyRef: []byte("sealed")}
	tokenCA := store.CACert{Role: "agent", Serial: "a1", State: store.CAActive, KeyRef: tokenRef("muster-ca%2Fagent%2Fa1")}
	sealedSigner := store.Signer{VersionID: "v1", State: store.SignerActive, KeyRef: []byte("sealed")}
	tokenSigner := store.Signer{VersionID: "v2", State: store.SignerActive, KeyRef: tokenRef("muster-signer%2Fv2")}
	for _, c := range []struct {
		name string
		st   recordedCustody
		key  string // the sealed key the refusal names; "" when it starts
	}{
		{"restored from before the migration", recordedCustody{cas: []store.CACert{tokenCA, sealedCA}, signers: []store.Signer{tokenSigner}}, "the active server intermediate 5e"},
		{"a sealed active signer", recordedCustody{cas: []store.CACert{tokenCA}, signers: []store.Signer{sealedSigner}}, "the active task signer v1"},
		{"every key in use in the token", recordedCustody{cas: []store.CACert{tokenCA, {Role: "server", Serial: "5e", State: store.CARetiring, KeyRef: []byte("sealed")}},
			signers: []store.Signer{tokenSigner, {VersionID: "v1", State: store.SignerGrace, KeyRef: []byte("sealed")}}}, ""},
	} {
		got, err := storeCustody(ctx, c.st, offlineDir{dir: dir}, local, "")
		if c.key == "" {
			if err != nil || got != local {
				t.Errorf("%s: %+v %v; want authority.json's token", c.name, got, err)
			}
			continue
		}
		if !errors.Is(err, errCustodyOutOfStep) {
			t.Errorf("%s: %+v %v; want it refused", c.name, got, err)
			continue
		}
		for _, w := range []string{c.key, local.URI, "records no token",
			"muster-pkcs11 ca migrate-custody --data " + string(dir) + " --custody '" + local.URI + "' --pkcs11-module " + local.Module,
			"muster ca migrate-custody --data " + string(dir) + " --custody '" + local.URI + "' --rollback",
			// The objects the first run left: how to find them, with the
			// module and token (before: "to delete by hand", no command).
			"`pkcs11-tool --module /opt/hsm.so --token-label muster --login --list-objects --type privkey`"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v; want it to name %q", c.name, err, w)
			}
		}
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

// TestMigrateCustodyIntoAnotherTokenOpensNone: a migration into a token
// other than the one the store or authority.json already binds the keys
// to is refused before that token is opened (a login there spends one of
// its PIN tries), audited, and names the token to use. The static build
// cannot open a token at all, so a refusal that names the bound token
// shows that none was opened first.
func TestMigrateCustodyIntoAnotherTokenOpensNone(t *testing.T) {
	for _, tt := range []struct {
		name  string
		bind  func(t *testing.T, dir datadir.Dir)
		wants []string
	}{
		{"store", func(t *testing.T, dir datadir.Dir) {
			st, logger, _, err := openOffline(context.Background(), &Env{Getenv: func(string) string { return "" }}, string(dir), "", "")
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			link, err := logger.Builder(audit.Event{Actor: "test", Action: "ca.migrate_custody", Target: "pkcs11:token=first", Result: audit.ResultOK})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.RecordKeyCustody(context.Background(), store.KeyCustody{URI: "pkcs11:token=first", Module: "/opt/hsm.so"}, link.Build); err != nil {
				t.Fatal(err)
			}
			logger.Appended(link)
		}, []string{"the store records", "--custody 'pkcs11:token=first'", "muster ca migrate-custody --data " + "DIR" + " --custody 'pkcs11:token=first' --rollback"}},
		{"authority.json", func(t *testing.T, dir datadir.Dir) {
			info, err := dir.ReadInfo()
			if err != nil {
				t.Fatal(err)
			}
			info.Custody = &datadir.Custody{URI: "pkcs11:token=first", Module: "/opt/hsm.so", PINFile: "/etc/pin"}
			if err := dir.WriteInfo(info); err != nil {
				t.Fatal(err)
			}
		}, []string{"authority.json records the token pkcs11:token=first", "--custody 'pkcs11:token=first'"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			if code, _, stderr := runCLI(t, "init", "--data", dir); code != 0 {
				t.Fatalf("init: %s", stderr)
			}
			tt.bind(t, datadir.Dir(dir))
			code, _, stderr := runCLI(t, "ca", "migrate-custody", "--data", dir, "--custody", "pkcs11:token=second",
				"--pkcs11-module", "/opt/hsm.so", "--pkcs11-pin-file", "/etc/pin")
			if code == 0 {
				t.Fatal("the migration into another token was not refused")
			}
			for _, w := range tt.wants {
				if w = strings.ReplaceAll(w, "DIR", dir); !strings.Contains(stderr, w) {
					t.Errorf("the refusal does not say %q:\n%s", w, stderr)
				}
			}
			st, err := sqlite.Open(context.Background(), datadir.Dir(dir).DatabaseFile())
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			recs, err := st.ListAudit(context.Background(), store.AuditFilter{Action: "ca.migrate_custody"})
			if err != nil || len(recs) == 0 || !strings.Contains(recs[len(recs)-1].Reason, "pkcs11:token=first") {
				t.Errorf("the refusal is not audited: %+v %v", recs, err)
			}
		})
	}
}

// TestPrintMigrationSkippedSigner: with a sealed signer staged already the
// migration skips the signer, and its next steps say to activate or roll
// that one back and run the migration again, not "activate the staged
// signer" (which activated the sealed one and left the token signerless).
func TestPrintMigrationSkippedSigner(t *testing.T) {
	res := authority.CustodyMigrationResult{URI: "pkcs11:token=muster", Module: "/opt/hsm.so", Steps: []authority.MigrationStep{
		{Key: "ca/agent", Done: "prepared", Serial: "a1", Where: "pkcs11:token=muster;object=muster-ca%2Fagent%2Fa1", Next: "activate it"},
		{Key: "signer", Done: "skipped", Version: "v2", Next: "signer v2 (sealed) is staged"},
	}}
	var out strings.Builder
	printMigration(&out, res, "/var/lib/muster", "")
	if text := out.String(); strings.Contains(text, "Activate the staged signer") || !strings.Contains(text, "then run this command again: it stages a signer in the token") {
		t.Errorf("next steps after a skipped signer:\n%s", text)
	}
	res.Steps[1] = authority.MigrationStep{Key: "signer", Done: "staged", Version: "v3", Next: "activate it"}
	out.Reset()
	printMigration(&out, res, "/var/lib/muster", "")
	if text := out.String(); !strings.Contains(text, "Activate the staged signer") || strings.Contains(text, "skipped") {
		t.Errorf("next steps after a signer staged in the token:\n%s", text)
	}
}
