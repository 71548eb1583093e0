//go:build pkcs11 && cgo

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

// madeNow is a line of migrate-custody's output for a key it made in the
// token in that run.
var madeNow = regexp.MustCompile(`(?m)^  \S+ +(prepared|staged) `)

// TestPKCS11RestoreAcrossMigration: the two halves of a migration out of
// step after a restore (docs/hsm.md "Restoring across a migration").
// The store restored from a backup taken before muster ca migrate-custody
// under an authority.json that names the token: the authority refuses to
// start, audited, naming both ways out, and makes nothing in the token;
// --rollback (the token dropped from authority.json) starts it sealed,
// and, from the same restore, the migration run again starts it with the
// token. authority.json restored from before under the migrated store:
// refused, audited, naming the module flags and the migration run again,
// which records the token in authority.json so that it starts.
func TestPKCS11RestoreAcrossMigration(t *testing.T) {
	t.Parallel()
	tok := softhsmtest.New(t)
	env := tok.Env()
	dir, _ := initDir(t)
	startAuthority(t, dir).stop(t) // the intermediates into the store
	infoFile := filepath.Join(dir, "authority.json")
	sealedInfo, err := os.ReadFile(infoFile)
	if err != nil {
		t.Fatal(err)
	}
	backup := t.TempDir()
	copyStore(t, dir, backup)

	migrate := func(extra ...string) result {
		t.Helper()
		r := muster(t, env, append([]string{"ca", "migrate-custody", "--data", dir, "--custody", tok.URI}, extra...)...)
		if r.code != 0 {
			t.Fatalf("ca migrate-custody %v: exit %d\n%s%s", extra, r.code, r.stdout, r.stderr)
		}
		return r
	}
	withToken := []string{"--pkcs11-module", tok.Module, "--pkcs11-pin-file", tok.PINFile}
	migrate(withToken...)
	assertTokenKeys(t, tok, 5)
	migratedInfo, err := os.ReadFile(infoFile)
	if err != nil || !strings.Contains(string(migratedInfo), tok.URI) {
		t.Fatalf("authority.json after the migration: %s %v", migratedInfo, err)
	}
	authArgs := []string{"authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"}
	// The restore, as the operator guide says: the store's files, the
	// audit head file removed and the checkpoint moved aside.
	restoreStore := func() {
		t.Helper()
		copyStore(t, backup, dir)
		os.Remove(filepath.Join(dir, "audit-head"))
		os.Rename(filepath.Join(dir, "audit-checkpoint.json"), filepath.Join(t.TempDir(), "audit-checkpoint.json"))
	}
	refusedStart := func(what string, want ...string) {
		t.Helper()
		r := muster(t, env, authArgs...)
		if r.code == 0 {
			t.Fatalf("%s: the authority started\n%s", what, r.stderr)
		}
		for _, w := range want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: the refusal does not name %q:\n%s", what, w, r.stderr)
			}
		}
		// No authority runs to ask: the operator reads the refusal from
		// the data directory.
		r = muster(t, env, "audit", "list", "--offline", "--data", dir, "--action", "authority.start", "-o", "json")
		if r.code != 0 {
			t.Fatalf("%s: audit list --offline: exit %d\n%s", what, r.code, r.stderr)
		}
		var a []struct{ Result, Reason string }
		if err := json.Unmarshal([]byte(r.stdout), &a); err != nil {
			t.Fatal(err)
		}
		if len(a) == 0 || a[len(a)-1].Result != "denied" || !strings.Contains(a[len(a)-1].Reason, want[len(want)-1]) {
			t.Errorf("%s: the refusal is not audited: %+v", what, a)
		}
	}

	// 1. The store from before the migration, authority.json from after.
	restoreStore()
	refusedStart("the store restored from before the migration", tok.URI, "records no token", "signs with sealed keys (the active",
		"muster-pkcs11 ca migrate-custody --data "+dir+" --custody '"+tok.URI+"' --pkcs11-module "+tok.Module,
		"muster ca migrate-custody --data "+dir+" --custody '"+tok.URI+"' --rollback")
	assertTokenKeys(t, tok, 5) // the refused start made nothing there

	// Way out: stay sealed. The rollback drops the token from
	// authority.json and the authority starts without the module.
	if r := migrate("--rollback"); !strings.Contains(r.stdout, "removed from authority.json") {
		t.Errorf("--rollback over the restored store:\n%s", r.stdout)
	}
	if info, _ := os.ReadFile(infoFile); strings.Contains(string(info), "pkcs11") {
		t.Errorf("authority.json still names the token after --rollback:\n%s", info)
	}
	p := startAuthority(t, dir)
	if out := mustRun(t, "ca", "status", "--data", dir); strings.Contains(out, "pkcs11:") {
		t.Errorf("ca status after the rollback names the token:\n%s", out)
	}
	p.stop(t)

	// The other way out, from the same restore: the migration run again
	// prepares the successors and stages the signer in the token anew
	// (the first run's five objects are left there), and the authority
	// starts with the token.
	restoreStore()
	if err := os.WriteFile(infoFile, migratedInfo, 0o600); err != nil {
		t.Fatal(err)
	}
	refusedStart("the same restore again", "--rollback")
	if r := migrate(withToken...); len(madeNow.FindAllString(r.stdout, -1)) != 5 {
		t.Errorf("the migration run again over the restored store:\n%s", r.stdout)
	}
	assertTokenKeys(t, tok, 10)
	p, _ = startProcEnv(t, "authority", "authority started", env, authArgs...)
	if out := mustRun(t, "ca", "status", "--data", dir); strings.Count(out, "pkcs11:token=muster") != 4 {
		t.Errorf("ca status after the migration run again: want the 4 successors prepared in the token:\n%s", out)
	}
	p.stop(t)

	// 2. The reverse: authority.json from before the migration, the
	// store after. Refused without the module; the migration run again
	// finds it done and records the token in authority.json.
	if err := os.WriteFile(infoFile, sealedInfo, 0o600); err != nil {
		t.Fatal(err)
	}
	refusedStart("authority.json restored from before the migration", tok.URI, "--pkcs11-module PATH",
		"muster-pkcs11 ca migrate-custody --data "+dir+" --custody '"+tok.URI+"'")
	if r := migrate(withToken...); !strings.Contains(r.stdout, "already recorded") || madeNow.MatchString(r.stdout) {
		t.Errorf("the migration run again over the migrated store:\n%s", r.stdout)
	}
	assertTokenKeys(t, tok, 10)
	p, _ = startProcEnv(t, "authority", "authority started", env, authArgs...)
	checkTokenEnv(t, p, tok)
}
