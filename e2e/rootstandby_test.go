package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestStandbyWaitsForConnectedAgents: two replicas on one PostgreSQL, two
// agents streaming to replica B with 24-hour certificates (they renew
// only at about half of that), the operator on replica A taking
// update_servers and then standby at once. Standby is refused while the
// connected agents hold certificates under the old root, naming them and
// the way out; pasted, node.renew_now moves them under the new root, and
// standby then goes through with no renewal refused and no agent
// stopped. Before, standby went through and both agents were refused
// their next renewal and stopped ("agent stopped: permanent failure"),
// which no rollback undid without a restart by hand.
func TestStandbyWaitsForConnectedAgents(t *testing.T) {
	t.Parallel()
	_, rs := startReplicas(t, 2)
	a, b := rs[0], rs[1]
	ra := startRotationAgents(t, b, "behind")

	st := caRoot(t, a.dir, "rotate")
	newRoot := pemFile(t, "new-root.pem", st.NewRoot.PEM)
	for _, want := range []string{"update_agents", "update_servers"} {
		if st = caRoot(t, a.dir, "next-phase"); st.Phase != want {
			t.Fatalf("next-phase: phase %s, want %s", st.Phase, want)
		}
	}
	mustRun(t, "admin", "renew", "--data", a.dir)
	msg := mustFail(t, "ca", "root", "next-phase", "--data", a.dir)
	for _, want := range []string{"FAILED_PRECONDITION", "2 connected agents (behind-0, behind-1) still hold a certificate under it",
		"muster task send --type node.renew_now --all, then run muster ca root next-phase again"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("standby with both agents under the old root: %q, want %q", msg, want)
		}
	}
	if st := caRoot(t, a.dir, "status"); st.Phase != "update_servers" {
		t.Fatalf("the refused standby moved the rotation to %s", st.Phase)
	}
	if out := mustRun(t, "audit", "list", "--data", a.dir, "--action", "ca.root_phase"); !strings.Contains(out, "2 connected agents") {
		t.Errorf("the refused standby is not audited with its reason:\n%s", out)
	}

	// The way out, pasted (through replica A: the agents' streams are B's).
	mustRun(t, "task", "send", "--type", "node.renew_now", "--all", "--data", a.dir)
	for i := range ra.dirs {
		waitFor(t, 60*time.Second, fmt.Sprintf("agent-%d renewed under the new root", i), func() bool { return ra.chainsTo(i, newRoot) })
	}
	if st = caRoot(t, a.dir, "next-phase"); st.Phase != "standby" {
		t.Fatalf("next-phase once the agents renewed: phase %s, want standby", st.Phase)
	}
	for i := range ra.dirs {
		before := ra.serial(i)
		mustRun(t, "task", "send", "--type", "node.renew_now", "--node", fmt.Sprintf("behind-%d", i), "--data", a.dir)
		waitFor(t, 60*time.Second, fmt.Sprintf("agent-%d renewed in standby", i), func() bool { return ra.serial(i) != before })
	}
	ra.stopCheckingNoFailure(t, "standby after update_servers at once")
}
