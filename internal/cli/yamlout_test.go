package cli

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestYAMLOutputIsYAML: -o yaml prints YAML, not the JSON document, on a
// command whose structured output is built in place (keypair create, one
// of those that wrote JSON for both formats).
func TestYAMLOutputIsYAML(t *testing.T) {
	code, stdout, stderr := runCLI(t, "keypair", "create", "--data", filepath.Join(t.TempDir(), "a"), "-o", "yaml")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.HasPrefix(stdout, "public_key: ssh-ed25519 ") || !strings.Contains(stdout, "\nfingerprint: SHA256:") {
		t.Fatalf("keypair create -o yaml printed:\n%s", stdout)
	}
}
