package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAbandonedRootClosesTheStreamsUnderIt: a root rotation reaches
// update_servers, where agent-0 gets a certificate under the new root
// (stopped, renewed, started again, so its ten-minute certificate does
// not renew on its own during the test) while agent-1 keeps one under the
// old root; the rotation is then rolled back to init. Abandoning it, with
// agent-0's certificate under the new root still valid, is refused naming
// the wait and --abandon-now; with --abandon-now it goes to none. The authority closes agent-0's open stream at once, audited
// agent.stream_close with the refusal that names the way out (a join over
// its identity), and lists it disconnected, rather than keeping it
// connected until its next renewal is refused; agent-1's stream stays
// open. (Before, the stream stayed open, counted connected and fed trust
// bundles, until the agent's renewal minutes later.)
func TestAbandonedRootClosesTheStreamsUnderIt(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "10m")
	ra := startRotationAgents(t, e, "abandon")
	node0 := "abandon-0"

	st := caRoot(t, e.dir, "rotate")
	newRoot := pemFile(t, "new-root.pem", st.NewRoot.PEM)
	waitFor(t, agentReach, "agent-0 takes the new root in init", func() bool { return len(ra.rootsOf(0)) == 2 })
	if st = caRoot(t, e.dir, "next-phase"); st.Phase != "update_agents" {
		t.Fatalf("next-phase from init: %+v", st)
	}
	if st = caRoot(t, e.dir, "next-phase"); st.Phase != "update_servers" {
		t.Fatalf("next-phase from update_agents: %+v", st)
	}
	ra.procs[0].stop(t)
	mustRun(t, "agent", "renew", "--data", ra.dirs[0])
	if !ra.chainsTo(0, newRoot) {
		t.Fatalf("agent-0 renewed in update_servers to a leaf not under the new root")
	}
	ra.start(0, nil)
	waitFor(t, agentReach, "agent-0's stream under the new root is open", func() bool { return connected(t, e.dir, node0) })

	for _, want := range []string{"update_agents", "init"} {
		if st = caRoot(t, e.dir, "rollback"); st.Phase != want {
			t.Fatalf("rollback: phase %s, want %s", st.Phase, want)
		}
	}
	// agent-0's certificate under the new root is valid for 10 minutes:
	// abandoning now would strand it, so a plain rollback is refused,
	// naming the wait and the forced way.
	if msg := mustFail(t, "ca", "root", "rollback", "--data", e.dir); !strings.Contains(msg, "muster ca root rollback --abandon-now") {
		t.Fatalf("abandoning under an agent certificate of the new root: %s; want a refusal naming --abandon-now", msg)
	}
	if st = caRoot(t, e.dir, "rollback", "--abandon-now"); st.Phase != "none" {
		t.Fatalf("rollback --abandon-now: phase %s, want none", st.Phase)
	}

	var closed auditRec
	waitFor(t, agentReach, "agent-0's stream closed, audited", func() bool {
		for _, r := range auditOf(t, e.dir, "agent.stream_close") {
			if r.Target == node0 {
				closed = r
				return true
			}
		}
		return false
	})
	for _, want := range []string{"no longer trusts", "muster agent join --force --data ADIR --node " + node0} {
		if !strings.Contains(closed.Reason, want) {
			t.Errorf("agent.stream_close of %s: reason %q lacks %q", node0, closed.Reason, want)
		}
	}
	waitFor(t, agentReach, "agent-0 listed disconnected", func() bool { return !connected(t, e.dir, node0) })
	if !connected(t, e.dir, "abandon-1") {
		t.Errorf("agent-1, under the old root, is no longer connected after the rollback to none")
	}
	for _, r := range auditOf(t, e.dir, "agent.stream_close") {
		if r.Target == "abandon-1" {
			t.Errorf("agent-1's stream, under the old root, was closed: %+v", r)
		}
	}
}

// connected reports whether muster agents show lists node's stream
// connected.
func connected(t *testing.T, dir, node string) bool {
	t.Helper()
	var a struct {
		Agent struct {
			Stream *struct {
				Connected bool `json:"connected"`
			} `json:"stream"`
		} `json:"agent"`
	}
	out := mustRun(t, "agents", "show", node, "--data", dir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		t.Fatalf("agents show %s -o json printed %q: %v", node, out, err)
	}
	return a.Agent.Stream != nil && a.Agent.Stream.Connected
}
