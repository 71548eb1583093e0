package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLockStopsARunningAgent: a lock on the node of a running agent
// stops it, as docs/install.md and the operator guide say ("a deleted or
// locked node stops the agent for good"), naming the reason. The
// authority closes the agent's stream at the lock and refuses it again:
// the agent then renews at once, and the renewal's refusal stops it.
// Before, it reconnected its stream every 2 minutes until its renewal
// was due, half its certificate's lifetime later (12 hours by default).
func TestLockStopsARunningAgent(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinAgent(t, e, "web-1")
	agent, _ := startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	mustRun(t, "lock", "create", "--data", e.dir, "--node", "web-1", "--reason", "stolen")
	stoppedFor(t, agent, "locked")
	if !strings.Contains(agent.Logs(), "muster lock list") {
		t.Errorf("the locked agent's last words name no way out:\n%s", agent.Logs())
	}
}

// TestRestoredAgentDirectoryNamesTheWayOut: an agent whose data directory
// is restored from a copy older than its last renewal presents an older
// generation: the authority takes it for a copy and locks the instance
// (rightly: it cannot tell a restore from a theft). The refusal, and every
// refusal after it, names the way out: join again over the identity with
// a token bound to the node. Before, it said only
// "PERMISSION_DENIED: copy_detected", then "locked".
func TestRestoredAgentDirectoryNamesTheWayOut(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinAgent(t, e, "web-1")
	backup := filepath.Join(t.TempDir(), "backup")
	if out, err := exec.Command("cp", "-a", adir, backup).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	mustRun(t, "agent", "renew", "--data", adir)
	rejoin := "muster agent join --force --data " + backup + " --node web-1"
	for _, want := range []string{"copy_detected", "locked"} {
		r := muster(t, nil, "agent", "renew", "--data", backup)
		if r.code == 0 || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, rejoin) {
			t.Errorf("renewal of the restored directory: exit %d\n%s\nwant %s naming %q", r.code, r.stderr, want, rejoin)
		}
	}
	// The way out works as named.
	tok := e.createToken(t, "--node", "web-1")
	if r := muster(t, nil, "agent", "join", "--force", "--data", backup, "--node", "web-1", tok.URI); r.code != 0 {
		t.Fatalf("join again: exit %d\n%s", r.code, r.stderr)
	}
	mustRun(t, "agent", "renew", "--data", backup)
}

// stoppedFor waits for the agent p to stop for good, refused for reason
// (a lock, a deletion or a supersession made while it ran stops it).
func stoppedFor(t *testing.T, p *proc, reason string) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent still runs a minute after it was %s:\n%s", reason, p.Logs())
	}
	if p.exitErr == nil || !strings.Contains(p.Logs(), `"reason":"`+reason+`"`) || !strings.Contains(p.Logs(), "permanent failure") {
		t.Fatalf("the agent, %s, ended with %v:\n%s", reason, p.exitErr, p.Logs())
	}
}
