package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLockWithTTLPausesARunningAgent: a lock with a TTL on the node of a
// running agent closes its stream (within a second, DESIGN.md) and its
// renewal is refused ("locked"), and once the lock has expired the agent
// renews and opens its stream again by itself, with no restart: the
// refusal says when the lock ends, and the agent waits until then. Before,
// the refused renewal stopped the agent for good, and the operator had to
// start it again by hand on every machine after the lock expired.
func TestLockWithTTLPausesARunningAgent(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinAgent(t, e, "web-1")
	agent, _ := startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	// Long enough that the stream's close (within a second of the lock)
	// and the renewal it prompts are refused on a loaded machine.
	locked := time.Now()
	mustRun(t, "lock", "create", "--data", e.dir, "--node", "web-1", "--ttl", "8s", "--reason", "maintenance")
	waitLog(t, agent, "stream to the authority closed: refused for the node's standing", 1, time.Minute)
	waitLog(t, agent, "renewed", 1, 2*time.Minute)
	renewed := time.Since(locked)
	waitLog(t, agent, "stream to the authority open", 2, 2*time.Minute)
	t.Logf("locked for 8s: renewed %s and the stream open again %s after the lock was made", renewed.Round(100*time.Millisecond), time.Since(locked).Round(100*time.Millisecond))
	if st := agentState(t, adir); st.Generation < 1 {
		t.Errorf("generation %d after the lock ended, want a renewal", st.Generation)
	}
	if logs := agent.Logs(); !strings.Contains(logs, `"reason":"locked"`) || strings.Contains(logs, "permanent failure") {
		t.Errorf("the agent, locked for 8s, did not wait out the lock:\n%s", logs)
	}
}

// TestLockWithoutTTLKeepsTheAgentWaiting: a lock without a TTL closes the
// agent's stream and refuses its renewal, and the agent keeps running,
// saying the lock ends when deleted and naming the way out, so that
// muster lock delete brings it back (at its next attempt, within 15
// minutes) without a restart. Before, it stopped for good.
func TestLockWithoutTTLKeepsTheAgentWaiting(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := joinAgent(t, e, "web-1")
	agent, _ := startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	mustRun(t, "lock", "create", "--data", e.dir, "--node", "web-1", "--reason", "stolen")
	waitingOutLock(t, agent)
}

// waitingOutLock waits for the running agent p to be refused its renewal
// for a lock without a TTL, and checks that it keeps running, saying the
// lock ends when deleted and naming the way out.
func waitingOutLock(t *testing.T, p *proc) {
	t.Helper()
	waitLog(t, p, "renewal refused: locked; asking again", 1, time.Minute)
	logs := p.Logs()
	for _, want := range []string{"when deleted (muster lock delete LOCK-ID)", "muster lock list names the lock"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the locked agent's log does not say %q:\n%s", want, logs)
		}
	}
	select {
	case <-p.done:
		t.Fatalf("the locked agent stopped: %v\n%s", p.exitErr, p.Logs())
	default:
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
// (a deletion or a supersession made while it ran stops it).
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
