package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRestoreBeforeTheAgentsSignerNamesTheWayOut: through the built
// binary, the store is restored from a backup taken before the stage of
// the signer the agent now holds as active, so no key can sign a set the
// agent takes (docs/signer-lifecycle.md, "Restoring the store": such
// agents must join again). Everything the operator and the machine are
// shown names that way out, and it works pasted:
//
//   - muster agent trust refresh, with the store behind the agent and
//     then past it on other signers, exits non-zero naming the join
//     (before, behind: exit 0, "Verifier set version 3", as if current;
//     past: a bare "not signed by a key this agent holds");
//   - the authority's refusal to follow the set the agent's heartbeat
//     shows is audited naming the join (before: only the docs);
//   - the agent's refusal of a task signed by the store's active signer
//     is audited with the refresh and the join, not "send it again",
//     which would sign it with that same signer;
//   - after muster agent join --force with a new token, the agent holds
//     the store's set and runs a task.
func TestRestoreBeforeTheAgentsSignerNamesTheWayOut(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	addr := e.auth.addr
	adir := joinAgent(t, e, "ahead")

	backup := t.TempDir()
	e.auth.stop(t)
	copyStore(t, e.dir, backup)
	e.auth = startAuthority(t, e.dir, "--listen", addr)

	mustRun(t, "signer", "stage", "--data", e.dir)
	mustRun(t, "signer", "activate", "--data", e.dir)
	mustRun(t, "agent", "trust", "refresh", "--data", adir)
	if st := agentStatus(t, adir); st["verifier_set_version"] != float64(3) {
		t.Fatalf("before the restore the agent holds version %v, want 3", st["verifier_set_version"])
	}

	// The restore, as the operator guide says.
	e.auth.stop(t)
	copyStore(t, backup, e.dir)
	os.Remove(filepath.Join(e.dir, "audit-head"))
	os.Rename(filepath.Join(e.dir, "audit-checkpoint.json"), filepath.Join(t.TempDir(), "audit-checkpoint.json"))
	e.auth = startAuthority(t, e.dir, "--listen", addr)

	rejoin := "muster agent join --force --data " + adir + " --node ahead with a joining URI from muster token create --node ahead"
	refreshNamesTheJoin := func(when string) {
		t.Helper()
		r := muster(t, nil, "agent", "trust", "refresh", "--data", adir)
		if r.code == 0 || !strings.Contains(r.stderr, rejoin) || !strings.Contains(r.stderr, "Restoring the store") {
			t.Fatalf("agent trust refresh with the store %s: exit %d, want non-zero naming %q\n%s%s", when, r.code, rejoin, r.stdout, r.stderr)
		}
	}
	refreshNamesTheJoin("behind the agent (version 1)")

	// The running agent's heartbeat shows the authority the set ahead; it
	// cannot follow it, and its refusal names the join.
	agentProc, _ := startProc(t, "ahead", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	waitFor(t, agentReach, "the refused advance is audited", func() bool {
		for _, r := range auditOf(t, e.dir, "node_task_signer.advance") {
			if r.Result == "denied" {
				if !strings.Contains(r.Reason, "muster agent join --force --data ADIR --node NODE with a joining URI from muster token create --node NODE") {
					t.Fatalf("the refused advance does not name the join:\n%s", r.Reason)
				}
				return true
			}
		}
		return false
	})

	// Steps on the restored store take it past the agent, on signers the
	// agent never heard of; the stage's rotate task waits for the agent.
	mustRun(t, "signer", "stage", "--data", e.dir)
	mustRun(t, "signer", "activate", "--data", e.dir)
	mustRun(t, "signer", "stage", "--data", e.dir)
	if _, l := listSigners(t, e.dir); l.VerifierSetVersion != 4 {
		t.Fatalf("store verifier set version %d, want 4", l.VerifierSetVersion)
	}
	refreshNamesTheJoin("past the agent on other signers")

	got := sendReport(t, e.dir, "ahead")
	if got.Result != "denied" || !strings.Contains(got.Reason, "unknown_signer") {
		t.Fatalf("node.report by the store's active signer: %s %q, want denied unknown_signer", got.Result, got.Reason)
	}
	for _, want := range []string{"`muster agent trust refresh --data ADIR`", "muster agent join --force --data ADIR --node ahead with a joining URI from muster token create --node ahead"} {
		if !strings.Contains(got.Reason, want) {
			t.Fatalf("the refusal's audit record does not name %q:\n%s", want, got.Reason)
		}
	}
	if strings.Contains(got.Reason, "send it again") {
		t.Fatalf("the refusal's audit record says to send the task again, which signs it with the signer refused:\n%s", got.Reason)
	}

	// The way out, pasted: a new token for the node, the join over the
	// identity; the agent then holds the store's set and runs tasks.
	agentProc.stop(t)
	if r := muster(t, nil, "agent", "join", "--force", "--data", adir, "--node", "ahead", e.createToken(t, "--node", "ahead").URI); r.code != 0 {
		t.Fatalf("join --force: exit %d\n%s", r.code, r.stderr)
	}
	ids := signerIDs(t, e.dir)
	if !holds(t, adir, 4, map[string]string{ids[1]: "grace", ids[2]: "active", ids[3]: "staged"}) {
		t.Fatalf("after the join the agent holds %v, want the store's set 4", agentStatus(t, adir))
	}
	mustRun(t, "agent", "trust", "refresh", "--data", adir)
	startProc(t, "ahead again", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	if got := sendReport(t, e.dir, "ahead"); got.Result != "ok" {
		t.Fatalf("node.report after the join: %s %q", got.Result, got.Reason)
	}
}
