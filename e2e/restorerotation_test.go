package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRestoreDuringRootRotation walks a restore of a backup taken in
// the root rotation's update_agents phase, after the rotation moved on
// to update_servers (where the intermediates are signed by the new root
// and the running agents renewed under them): the restored store is
// back in update_agents. The agents' certificates of update_servers are
// signed by intermediates the restored store never held: the reapply's
// plan says each node joins again, each agent is refused and names the
// way out (muster agent join --force), which pasted with a new token
// works. The rejoined agents then keep renewing by themselves, never told
// to join again, while the rotation moves on to update_servers again and
// is rolled back, and the audit chain verifies.
func TestRestoreDuringRootRotation(t *testing.T) {
	t.Parallel()
	crlAddr := freePort(t)
	args := []string{"--agent-cert-ttl", "20s", "--crl-listen", crlAddr, "--crl-url", "http://" + crlAddr}
	e := newAgentEnv(t, args...)
	args = append(args, "--listen", e.auth.addr)
	restart := func() { e.auth = startAuthority(t, e.dir, args...) }
	w := &restoreWalk{t: t, e: e, crl: crlAddr, kids: map[string]string{}}
	a, b := w.agent("rot-a"), w.agent("rot-b")
	a.start()
	b.start()

	if st := caRoot(t, e.dir, "rotate"); st.Phase != "init" {
		t.Fatalf("after rotate: %+v", st)
	}
	if st := caRoot(t, e.dir, "next-phase"); st.Phase != "update_agents" {
		t.Fatalf("next-phase from init: %+v", st)
	}
	backup := filepath.Join(t.TempDir(), "t1.db")
	mustRun(t, "store", "backup", "--data", e.dir, "--out", backup)
	if st := caRoot(t, e.dir, "next-phase"); st.Phase != "update_servers" {
		t.Fatalf("next-phase from update_agents: %+v", st)
	}
	renewedAll(t, a, b)

	plan := w.restore(backup, restart)
	if st := caRoot(t, e.dir, "status"); st.Phase != "update_agents" {
		t.Errorf("the restored store's phase: %+v, want update_agents", st)
	}
	// Their certificates of update_servers are signed by intermediates
	// the restored store never held: reapply says so, each agent is
	// refused and names the way out, which pasted works.
	for _, p := range []*walkAgent{a, b} {
		if !strings.Contains(plan, "node "+p.node+", instance ") || !strings.Contains(plan, "muster agent join --force --data ADIR --node "+p.node) {
			t.Errorf("the plan does not say %s joins again:\n%s", p.node, plan)
		}
		waitFor(t, 90*time.Second, p.node+" names the way out", func() bool {
			return strings.Contains(p.p.Logs(), "muster agent join --force --data "+p.dir+" --node "+p.node)
		})
		if r := muster(t, []string{"MUSTER_JOIN_URI=" + e.createToken(t, "--node", p.node).URI}, "agent", "join", "--force", "--data", p.dir, "--node", p.node); r.code != 0 {
			t.Fatalf("%s: the way out pasted: exit %d\n%s", p.node, r.code, r.stderr)
		}
		p.start()
	}
	if st := caRoot(t, e.dir, "next-phase"); st.Phase != "update_servers" {
		t.Fatalf("next-phase on the restored store: %+v", st)
	}
	renewedAll(t, a, b)
	if st := caRoot(t, e.dir, "rollback"); st.Phase != "update_agents" {
		t.Fatalf("rollback from update_servers: %+v", st)
	}
	renewedAll(t, a, b)
	for _, p := range []*walkAgent{a, b} {
		if logs := p.p.Logs(); strings.Contains(logs, "join again") {
			t.Errorf("%s, joined again, was told to join again:\n%s", p.node, logs)
		}
	}
	if out := mustRun(t, "audit", "verify", "--data", e.dir); !strings.Contains(out, "intact") {
		t.Errorf("audit verify at the end: %s", out)
	}
}
