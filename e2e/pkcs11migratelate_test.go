//go:build pkcs11 && cgo

package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

// TestPKCS11MigrateCustodyBesideAReplicaNotRestarted: a sealed authority
// with --ca-intermediate-ttl 2m runs on while muster ca migrate-custody
// prepares successors in a SoftHSM2 token, and is not restarted with the
// token before the time its clock would activate them (two thirds of the
// init-time intermediates' life) and prepare their successors (half of
// theirs). Not ready, unable to open the token's keys, it takes no CA
// step meanwhile: it neither activates a successor it cannot sign with
// nor prepares the next one sealed, which undid the migration (every
// active intermediate was sealed again once the replica was restarted
// with the token). Restarted with the token, it activates the token's
// successors, and no sealed intermediate but init's is ever made.
func TestPKCS11MigrateCustodyBesideAReplicaNotRestarted(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	env := tok.Env()
	dir, _ := initDir(t)
	authArgs := []string{"authority", "--data", dir, "--listen", freePort(t), "--metrics-listen", "127.0.0.1:0", "--log-format", "json",
		"--ca-intermediate-ttl", "2m"}
	p, rec := startProcEnv(t, "authority", "authority started", env, authArgs...)
	p.addr, _ = rec["advertise"].(string)

	type caCert struct {
		Kind       string `json:"kind"`
		Role       string `json:"role"`
		State      string `json:"state"`
		Serial     string `json:"serial"`
		KeyCustody string `json:"key_custody"`
	}
	status := func() []caCert {
		t.Helper()
		var st struct {
			Certificates []caCert `json:"certificates"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, "ca", "status", "--data", dir, "-o", "json")), &st); err != nil {
			t.Fatal(err)
		}
		var out []caCert
		for _, c := range st.Certificates {
			if c.Kind == "intermediate" {
				out = append(out, c)
			}
		}
		return out
	}
	initSerials := map[string]bool{}
	for _, c := range status() {
		initSerials[c.Serial] = true
	}
	if len(initSerials) != 4 {
		t.Fatalf("after init: %d intermediates, want 4", len(initSerials))
	}
	issued := activeIntermediate(t, dir, "agent").cert.NotBefore.Add(time.Minute) // backdated a minute

	if r := muster(t, env, "ca", "migrate-custody", "--data", dir, "--custody", tok.URI,
		"--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile); r.code != 0 {
		t.Fatalf("ca migrate-custody: exit %d\n%s", r.code, r.stderr)
	}

	// Past two thirds of the init-time intermediates' life (80 s) and
	// half of the successors' (60 s after the migration), with three of
	// the leader's 5-second looks to spare.
	time.Sleep(time.Until(issued.Add(95 * time.Second)))
	for _, c := range status() {
		inToken := strings.HasPrefix(c.KeyCustody, "pkcs11:")
		if initSerials[c.Serial] && c.State != "active" || !initSerials[c.Serial] && (c.State != "prepared" || !inToken) {
			t.Errorf("the replica without the token stepped: %s intermediate %s is %s, key %s", c.Role, c.Serial, c.State, c.KeyCustody)
		}
	}

	// Restarted with the token (authority.json names it now), it takes
	// the steps it held back.
	p.stop(t)
	p, rec = startProcEnv(t, "authority", "authority started", env, authArgs...)
	p.addr, _ = rec["advertise"].(string)
	waitFor(t, 60*time.Second, "every active intermediate in the token", func() bool {
		n := 0
		for _, c := range status() {
			if c.State == "active" && strings.HasPrefix(c.KeyCustody, "pkcs11:") {
				n++
			}
		}
		return n == 4
	})
	for _, c := range status() {
		if !initSerials[c.Serial] && !strings.HasPrefix(c.KeyCustody, "pkcs11:") && c.KeyCustody != "destroyed" {
			t.Errorf("a %s intermediate %s (%s) made after the migration has key custody %q", c.Role, c.Serial, c.State, c.KeyCustody)
		}
	}
	waitFor(t, 20*time.Second, "the restarted authority is ready", func() bool {
		body, err := scrapePath(p.metrics, "/readyz")
		return err == nil && body == "ready\n"
	})
}
