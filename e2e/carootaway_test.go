package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRootRotationAgentsAway: two agents joined and not running. In init,
// muster agent trust refresh brings one the new root (through the
// cross-certificate) with the verifier set; it renews in update_servers
// and still renews in standby. The other stays away through the whole
// rotation: in standby its renewal is refused with an error that names
// the join over its identity that brings it back, and that join, with a
// new token's URI (pinned to the new root), does.
func TestRootRotationAgentsAway(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	join := func(node string) string {
		adir := filepath.Join(t.TempDir(), node)
		tok := e.createToken(t)
		if r := muster(t, nil, "agent", "join", "--data", adir, "--node", node, tok.URI); r.code != 0 {
			t.Fatalf("agent join %s: exit %d\n%s", node, r.code, r.stderr)
		}
		return adir
	}
	roots := func(adir string) int {
		b, _ := os.ReadFile(filepath.Join(adir, "certs", "ca.crt"))
		return bytes.Count(b, []byte("BEGIN CERTIFICATE"))
	}
	refreshed, away := join("refreshed"), join("away")

	caRoot(t, e.dir, "rotate")
	out := mustRun(t, "agent", "trust", "refresh", "--data", refreshed)
	if roots(refreshed) != 2 || !strings.Contains(out, "2 trusted roots") {
		t.Fatalf("agent trust refresh in init: ca.crt holds %d roots; printed %q", roots(refreshed), out)
	}
	caRoot(t, e.dir, "next-phase")
	caRoot(t, e.dir, "next-phase")
	mustRun(t, "agent", "renew", "--data", refreshed)
	mustRun(t, "admin", "renew", "--data", e.dir)
	if st := caRoot(t, e.dir, "next-phase"); st.Phase != "standby" {
		t.Fatalf("phase %s, want standby", st.Phase)
	}
	mustRun(t, "agent", "renew", "--data", refreshed)

	r := muster(t, nil, "agent", "renew", "--data", away)
	if r.code == 0 {
		t.Fatal("an agent that trusts only the old root renewed in standby")
	}
	for _, want := range []string{"does not chain to the roots in " + filepath.Join(away, "certs", "ca.crt"),
		"muster agent join --force --data " + away + " --node away with a joining URI from muster token create --node away", "docs/ca-lifecycle.md"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, r.stderr)
		}
	}
	tok := e.createToken(t, "--node", "away")
	if r := muster(t, nil, "agent", "join", "--force", "--data", away, "--node", "away", tok.URI); r.code != 0 {
		t.Fatalf("the join the refusal names: exit %d\n%s", r.code, r.stderr)
	}
	if roots(away) != 1 {
		t.Fatalf("after the join ca.crt holds %d roots, want the new one", roots(away))
	}
	mustRun(t, "agent", "renew", "--data", away)
}
