package e2e

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentRefusesUnusablePSKs: a PSK the agent cannot use is named as
// such, before anything is sent: all zeros (a placeholder, never a
// generated PSK) is invalid, and bare hex without the muster-psk: prefix
// may be another secret pasted in the wrong place.
func TestAgentRefusesUnusablePSKs(t *testing.T) {
	fp := "sha256:" + strings.Repeat("ab", 32)
	for _, tt := range []struct{ name, key, want string }{
		{"all zeros", "muster-psk:" + strings.Repeat("0", 64), "PSK is invalid"},
		{"no prefix", strings.Repeat("0a", 32), "PSK is malformed"},
	} {
		adir := filepath.Join(t.TempDir(), "agent")
		r := muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + tt.key, "MUSTER_CA_FINGERPRINT=" + fp},
			"agent", "join", "--data", adir, "--node", "n1", "--authority", "127.0.0.1:1")
		if r.code == 0 || !strings.Contains(r.stderr, tt.want) || strings.Contains(r.stderr, "no join token") {
			t.Errorf("%s: exit %d, stderr %q; want %q", tt.name, r.code, r.stderr, tt.want)
		}
		assertNoAgentCerts(t, adir)
	}
}
