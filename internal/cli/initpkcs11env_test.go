package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/datadir"
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

// TestInitNextNamesTheBuildThatOpensTheToken: the command init prints
// as the next step is the one that starts the authority it made: after
// init --custody pkcs11:…, muster-pkcs11 (the static muster refuses an
// authority whose keys are in a token), else muster.
func TestInitNextNamesTheBuildThatOpensTheToken(t *testing.T) {
	for _, tc := range []struct {
		name    string
		custody *datadir.Custody
		want    string
	}{
		{"sealed", nil, "\nNext: muster authority --data /var/lib/muster/authority\n"},
		{"pkcs11", &datadir.Custody{URI: "pkcs11:token=muster"}, "\nNext: muster-pkcs11 authority --data /var/lib/muster/authority\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout strings.Builder
			res := datadir.InitResult{Dir: "/var/lib/muster/authority", Info: datadir.Info{Custody: tc.custody}}
			if err := printInit(&Env{Stdout: &stdout}, output{format: "text"}, res); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(stdout.String(), tc.want) {
				t.Errorf("init prints:\n%s\nwant %q", stdout.String(), tc.want)
			}
		})
	}
}
