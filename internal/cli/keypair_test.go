package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/boundkeypair"
)

func TestKeypairCreate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "agent")
	code, stdout, stderr := runCLI(t, "keypair", "create", "--data", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	pub, err := boundkeypair.ParsePublicKey(strings.TrimSpace(stdout))
	if err != nil {
		t.Fatalf("printed %q: %v", stdout, err)
	}
	priv, err := agent.LoadBoundKey(agent.Dir(dir))
	if err != nil || !pub.Ed25519().Equal(priv.Public()) {
		t.Fatalf("the printed key is not the stored one: %v", err)
	}
	if !strings.Contains(stderr, pub.Fingerprint()) {
		t.Errorf("stderr %q does not name the fingerprint", stderr)
	}
	// Never replaced.
	// ...and the refusal prints the kept key's public half, which the
	// first create's output may have been the only copy of.
	code, _, stderr = runCLI(t, "keypair", "create", "--data", dir)
	if code == 0 || !strings.Contains(stderr, "already holds a bound key") || !strings.Contains(stderr, strings.TrimSpace(stdout)) {
		t.Fatalf("second create: exit %d, %q", code, stderr)
	}
	// -o json on a fresh directory.
	code, stdout, _ = runCLI(t, "keypair", "create", "--data", filepath.Join(t.TempDir(), "b"), "-o", "json")
	var j struct {
		PublicKey   string `json:"public_key"`
		Fingerprint string `json:"fingerprint"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &j) != nil || !strings.HasPrefix(j.PublicKey, "ssh-ed25519 ") ||
		!strings.HasPrefix(j.Fingerprint, "SHA256:") {
		t.Fatalf("json: exit %d, %s", code, stdout)
	}
}
