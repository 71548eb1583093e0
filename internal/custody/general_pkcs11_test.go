//go:build pkcs11 && cgo

package custody_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
)

// TestPKCS11GeneralErrorSaysTheLikelyCause: a module that cannot work
// (SoftHSM2 whose configuration names a token directory that is not
// there, or whose configuration file is not there: SOFTHSM2_CONF not the
// file the token was made with) answers CKR_GENERAL_ERROR; opening the
// token says what that most often means and names the command that shows
// what the module sees, with the module, which, pasted, fails the same
// way (the diagnosis holds). Before, the operator got the bare code.
func TestPKCS11GeneralErrorSaysTheLikelyCause(t *testing.T) {
	tok := softhsmtest.Start(t)
	dir := t.TempDir()
	badDir := filepath.Join(dir, "softhsm2.conf")
	if err := os.WriteFile(badDir, []byte("directories.tokendir = "+filepath.Join(dir, "gone")+"\nobjectstore.backend = file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, conf := range []string{badDir, filepath.Join(dir, "missing.conf")} {
		t.Run(filepath.Base(conf), func(t *testing.T) {
			t.Setenv("SOFTHSM2_CONF", conf)
			_, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: tok.PINFile})
			if !errors.Is(err, custody.ErrModuleFailed) {
				t.Fatalf("OpenPKCS11 = %v, want ErrModuleFailed", err)
			}
			for _, want := range []string{"CKR_GENERAL_ERROR", "SOFTHSM2_CONF is not set", "directories.tokendir is missing", "partition) is not initialised"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("OpenPKCS11 = %v\nwant it to say %q", err, want)
				}
			}
			m := regexp.MustCompile("`(pkcs11-tool [^`]*)`").FindStringSubmatch(err.Error())
			if m == nil || !strings.Contains(m[1], "--module "+tok.Module+" ") {
				t.Fatalf("OpenPKCS11 = %v\nnames no pkcs11-tool command with the module", err)
			}
			out, err := exec.Command("sh", "-c", m[1]).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "CKR_GENERAL_ERROR") {
				t.Errorf("%s in the same environment: %v\n%s\nwant it to fail with CKR_GENERAL_ERROR too", m[1], err, out)
			}
		})
	}
	// Fixed, the same command lists the token.
	out, err := exec.Command("sh", "-c", "pkcs11-tool --module "+tok.Module+" --list-token-slots").CombinedOutput()
	if err != nil || !strings.Contains(string(out), softhsmtest.Label) {
		t.Errorf("pkcs11-tool --list-token-slots with the token's configuration: %v\n%s", err, out)
	}
}
