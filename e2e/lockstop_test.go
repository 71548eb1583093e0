package e2e

import (
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
	select {
	case <-agent.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the locked agent still runs a minute after the lock:\n%s", agent.Logs())
	}
	if agent.exitErr == nil || !strings.Contains(agent.Logs(), `"reason":"locked"`) || !strings.Contains(agent.Logs(), "permanent failure") {
		t.Fatalf("the locked agent ended with %v:\n%s", agent.exitErr, agent.Logs())
	}
}
