//go:build pkcs11 && cgo

package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

// TestPKCS11OfflineCommandsReadTheTokenVariables: MUSTER_PKCS11_MODULE
// and MUSTER_PKCS11_PIN_FILE, which the authority reads (its unit's
// authority.env), open the token for the offline commands too, as their
// flags would: muster ca migrate-custody given only the variables moves a
// sealed authority into the token; with the PIN file authority.json
// records moved away, muster admin add --offline (break-glass, the admin
// intermediate's key in the token) and muster ca rotate --offline (a lost
// key replaced) open the token with the variable's PIN file.
func TestPKCS11OfflineCommandsReadTheTokenVariables(t *testing.T) {
	t.Parallel()
	t.Run("migrate-custody", func(t *testing.T) {
		t.Parallel()
		tok := softhsmtest.New(t)
		dir, _ := initDir(t)
		env := append(tok.Env(), "MUSTER_PKCS11_MODULE="+tok.Module, "MUSTER_PKCS11_PIN_FILE="+tok.PINFile)
		r := muster(t, env, "ca", "migrate-custody", "--data", dir, "--custody", tok.URI)
		if r.code != 0 {
			t.Fatalf("ca migrate-custody with MUSTER_PKCS11_MODULE and MUSTER_PKCS11_PIN_FILE: exit %d\n%s", r.code, r.stderr)
		}
		if info, _ := os.ReadFile(filepath.Join(dir, "authority.json")); !strings.Contains(string(info), tok.Module) {
			t.Errorf("authority.json does not record the module the variable gave:\n%s", info)
		}
	})
	t.Run("offline", func(t *testing.T) {
		t.Parallel()
		tok, env, dir := initCustody(t)
		pin := filepath.Join(t.TempDir(), "pkcs11-pin")
		if err := os.Rename(tok.PINFile, pin); err != nil {
			t.Fatal(err)
		}
		withPIN := append(env, "MUSTER_PKCS11_PIN_FILE="+pin)
		out := filepath.Join(t.TempDir(), "bob.identity")
		if r := muster(t, env, "admin", "add", "bob", "--offline", "--data", dir, "--out", out); r.code == 0 {
			t.Fatal("admin add --offline opened the token with the PIN file moved away: the test proves nothing")
		}
		if r := muster(t, withPIN, "admin", "add", "bob", "--offline", "--data", dir, "--out", out); r.code != 0 {
			t.Fatalf("admin add --offline with MUSTER_PKCS11_PIN_FILE: exit %d\n%s", r.code, r.stderr)
		}

		o, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
			"--list-objects", "--type", "privkey").CombinedOutput()
		label := regexp.MustCompile(`muster-ca/agent/[0-9a-f]+`).FindString(string(o))
		if err != nil || label == "" {
			t.Fatalf("no agent intermediate's key in the token: %v\n%s", err, o)
		}
		if o, err := tok.Command("pkcs11-tool", "--module", tok.Module, "--token-label", softhsmtest.Label, "--login", "--pin", softhsmtest.PIN,
			"--delete-object", "--type", "privkey", "--label", label).CombinedOutput(); err != nil {
			t.Fatalf("pkcs11-tool --delete-object: %v\n%s", err, o)
		}
		r := muster(t, withPIN, "ca", "rotate", "agent", "--offline", "--data", dir)
		if r.code != 0 || !strings.Contains(r.stdout, "Activated the agent intermediate") {
			t.Fatalf("ca rotate agent --offline with MUSTER_PKCS11_PIN_FILE: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})
}
