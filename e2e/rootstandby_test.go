package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
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

// TestStandbyWaitsForAgentsAway: of two agents streaming under the old
// root, one is stopped (away: seen, its certificate still valid). ca
// status counts it away and warns it has not reported the new root;
// once the connected one renewed under the new root, standby is refused
// naming the one away and --leave-away, which then takes it, saying so.
// Before, standby went through and the agent away was refused its
// renewal when back, with nothing naming it before.
func TestStandbyWaitsForAgentsAway(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	ra := startRotationAgents(t, e, "away")
	type caStatus struct {
		Connected int      `json:"connected_agents"`
		Away      int      `json:"away_agents"`
		Warnings  []string `json:"warnings"`
	}
	status := func() caStatus {
		var s caStatus
		if out := mustRun(t, "ca", "status", "--data", e.dir, "-o", "json"); json.Unmarshal([]byte(out), &s) != nil {
			t.Fatalf("ca status -o json printed %q", out)
		}
		return s
	}
	waitFor(t, 60*time.Second, "both agents connected", func() bool { return status().Connected == 2 })
	ra.procs[1].stop(t)
	waitFor(t, 60*time.Second, "agent 1 away", func() bool { s := status(); return s.Connected == 1 && s.Away == 1 })

	st := caRoot(t, e.dir, "rotate")
	newRoot := pemFile(t, "new-root.pem", st.NewRoot.PEM)
	if s := status(); !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, "and 1 of 1 agents away") }) {
		t.Errorf("ca status during the rotation warns %q; want the agent away counted as not holding the new root", s.Warnings)
	}
	caRoot(t, e.dir, "next-phase")
	caRoot(t, e.dir, "next-phase")
	mustRun(t, "admin", "renew", "--data", e.dir)
	mustRun(t, "task", "send", "--type", "node.renew_now", "--all", "--data", e.dir)
	waitFor(t, 60*time.Second, "agent 0 renewed under the new root", func() bool { return ra.chainsTo(0, newRoot) })

	msg := mustFail(t, "ca", "root", "next-phase", "--data", e.dir)
	for _, want := range []string{"FAILED_PRECONDITION", "1 agent seen before but away now (away-1)", "muster ca root next-phase --leave-away"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("standby with agent away-1 away under the old root: %q, want %q", msg, want)
		}
	}
	if st := caRoot(t, e.dir, "status"); st.Phase != "update_servers" {
		t.Fatalf("the refused standby moved the rotation to %s", st.Phase)
	}
	r := muster(t, nil, "ca", "root", "next-phase", "--leave-away", "--data", e.dir)
	if r.code != 0 || !strings.Contains(r.stderr, "warning: --leave-away") {
		t.Fatalf("next-phase --leave-away: %+v; want standby with a warning", r)
	}
	if st := caRoot(t, e.dir, "status"); st.Phase != "standby" {
		t.Fatalf("after --leave-away the rotation is in %s, want standby", st.Phase)
	}
	ra.procs[0].stop(t)
}
