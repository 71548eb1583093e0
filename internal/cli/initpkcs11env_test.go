package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInitSealedRefusesPKCS11FromTheEnvironmentNamingIt: init reads
// MUSTER_PKCS11_MODULE and MUSTER_PKCS11_PIN_FILE as the authority does,
// so a sealed init in an environment holding them (the unit's
// authority.env) is refused; the refusal names the variables and how to
// clear them, not only flags the operator never gave, and makes nothing.
func TestInitSealedRefusesPKCS11FromTheEnvironmentNamingIt(t *testing.T) {
	for _, v := range []string{"MUSTER_PKCS11_MODULE", "MUSTER_PKCS11_PIN_FILE"} {
		t.Run(v, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "authority")
			code, _, stderr := runCLIEnv(t, map[string]string{v: "/nonexistent/x"}, "init", "--data", dir)
			if code == 0 {
				t.Fatal("init succeeded with a PKCS#11 setting and no --custody")
			}
			if !strings.Contains(stderr, v) || !strings.Contains(stderr, "unset MUSTER_PKCS11_MODULE MUSTER_PKCS11_PIN_FILE") {
				t.Errorf("the refusal does not name %s and how to clear it:\n%s", v, stderr)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("init made %s", dir)
			}
		})
	}
}
