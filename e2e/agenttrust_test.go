package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentVerifierSet: an agent gets the verifier set with its join, a
// renewal and muster agent trust refresh bring it a staged signer, and a
// static MUSTER_TASK_SIGNING_PUBKEYS list shows in its status.
func TestAgentVerifierSet(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", tok.URI); r.code != 0 {
		t.Fatalf("agent join: exit %d\n%s", r.code, r.stderr)
	}
	accepted := func(st map[string]any) map[string]any { return acceptedByNumber(st) }
	st := agentStatus(t, adir)
	if st["verifier_set_version"] != float64(1) || accepted(st)["v1"] != "active" || len(accepted(st)) != 1 {
		t.Fatalf("after join: version %v, accepted %v", st["verifier_set_version"], st["accepted_signers"])
	}

	mustRun(t, "signer", "stage", "--data", e.dir, "--effective-in", "30m")
	out := mustRun(t, "agent", "trust", "refresh", "--data", adir)
	if !strings.Contains(out, "Verifier set version 2") {
		t.Fatalf("trust refresh printed %q", out)
	}
	st = agentStatus(t, adir)
	if st["verifier_set_version"] != float64(2) || accepted(st)["v1"] != "active" || accepted(st)["v2"] != "staged" {
		t.Fatalf("after refresh: version %v, accepted %v", st["verifier_set_version"], st["accepted_signers"])
	}
	// A renewal carries the set too: after the rollback, v2 is retired.
	mustRun(t, "signer", "rollback", "--data", e.dir)
	mustRun(t, "agent", "renew", "--data", adir)
	st = agentStatus(t, adir)
	if st["verifier_set_version"] != float64(3) || len(accepted(st)) != 1 || accepted(st)["v1"] != "active" {
		t.Fatalf("after renewal: version %v, accepted %v", st["verifier_set_version"], st["accepted_signers"])
	}
	if out := mustRun(t, "agent", "trust", "refresh", "--data", adir); !strings.Contains(out, "Verifier set version 3") {
		t.Fatalf("trust refresh with nothing newer printed %q", out)
	}

	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	r := muster(t, []string{"MUSTER_TASK_SIGNING_PUBKEYS=" + base64.RawURLEncoding.EncodeToString(pub)}, "agent", "status", "--data", adir)
	if r.code != 0 || !strings.Contains(r.stdout, "Static list:   1 keys from MUSTER_TASK_SIGNING_PUBKEYS") || !strings.Contains(r.stdout, "v1 (active)") {
		t.Fatalf("status with a static list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := muster(t, []string{"MUSTER_TASK_SIGNING_PUBKEYS=not-a-key"}, "agent", "status", "--data", adir); r.code == 0 || !strings.Contains(r.stderr, "MUSTER_TASK_SIGNING_PUBKEYS entry 1") {
		t.Fatalf("status with a malformed static list: exit %d\n%s", r.code, r.stderr)
	}
}
