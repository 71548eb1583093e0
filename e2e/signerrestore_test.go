package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRestoredStoreFollowsAgents: through the built binary, the store is
// restored from a backup taken before a stage the running agent saw. The
// agent's heartbeat carries the signed set it holds (version 2); the
// authority verifies it with the restored store's key, moves its version
// past it and publishes version 3, signed by v1, which the agent takes on
// its stream: it then trusts v1 alone (the lost staged key is gone).
func TestRestoredStoreFollowsAgents(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	addr := e.auth.addr
	adir := joinAgent(t, e, "restored")
	startProc(t, "restored", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	v1 := signerIDs(t, e.dir)[1]

	backup := t.TempDir()
	e.auth.stop(t)
	copyStore(t, e.dir, backup)
	e.auth = startAuthority(t, e.dir, "--listen", addr)

	mustRun(t, "signer", "stage", "--data", e.dir)
	v2 := signerIDs(t, e.dir)[2]
	waitFor(t, 60*time.Second, "the agent takes the staged signer", func() bool {
		return holds(t, adir, 2, map[string]string{v1: "active", v2: "staged"})
	})

	// The restore, as the operator guide says.
	e.auth.stop(t)
	copyStore(t, backup, e.dir)
	os.Remove(filepath.Join(e.dir, "audit-head"))
	os.Rename(filepath.Join(e.dir, "audit-checkpoint.json"), filepath.Join(t.TempDir(), "audit-checkpoint.json"))
	e.auth = startAuthority(t, e.dir, "--listen", addr)

	waitFor(t, 90*time.Second, "the agent takes the set the restored store advanced to", func() bool {
		return holds(t, adir, 3, map[string]string{v1: "active"})
	})
	if _, l := listSigners(t, e.dir); l.VerifierSetVersion != 3 {
		t.Fatalf("store verifier set version %d, want 3", l.VerifierSetVersion)
	}
	if audit := mustRun(t, "audit", "list", "--data", e.dir, "--action", "node_task_signer.advance"); !strings.Contains(audit, "an agent holds version 2") {
		t.Fatalf("no advance audited:\n%s", audit)
	}
}
