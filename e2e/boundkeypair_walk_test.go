package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/shellword"
)

// restoreStore puts backup's store files back under the stopped authority
// in dir, as the operator guide says: the audit head file removed, the
// checkpoint file moved aside.
func restoreStore(t *testing.T, backup, dir string) {
	t.Helper()
	copyStore(t, backup, dir)
	os.Remove(filepath.Join(dir, "audit-head"))
	os.Rename(filepath.Join(dir, "audit-checkpoint.json"), filepath.Join(t.TempDir(), "audit-checkpoint.json"))
}

// TestBoundKeypairRestoredRefreshRetriesASpentBudget: through the built
// binary, a bound-keypair agent that only refreshed since the backup its
// authority's store was restored from. Its valid certificate is unknown to
// the restored store, so its refresh is a recovery, and with the budget
// spent it is refused recovery_exhausted. agent run keeps retrying it, as
// its hint says ("agent run retries by itself"), and comes back once the
// operator raises the limit, with no restart (it used to stop for good at
// a refresh, and only a recovery of an expired certificate was retried).
func TestBoundKeypairRestoredRefreshRetriesASpentBudget(t *testing.T) {
	t.Parallel()
	const ttl = "30s"
	e := newAgentEnv(t, "--agent-cert-ttl", ttl)
	addr := e.auth.addr
	adir := filepath.Join(t.TempDir(), "agent")
	// The first join takes the only recovery.
	joinBoundKeypair(t, e, adir, "runner", "1")

	backup := t.TempDir()
	e.auth.stop(t)
	copyStore(t, e.dir, backup)
	e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", ttl)

	// A refresh after the backup: a serial the restored store never saw.
	mustRun(t, "agent", "renew", "--data", adir)
	instance := agentState(t, adir).InstanceID

	e.auth.stop(t)
	restoreStore(t, backup, e.dir)
	e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", ttl)

	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
	waitLog(t, p, "renewal failed; retrying", 1, 60*time.Second)
	if logs := p.Logs(); !strings.Contains(logs, "recovery_exhausted") || !strings.Contains(logs, "agent run retries by itself") {
		t.Fatalf("the retried refusal is not the spent budget's, with its hint:\n%s", logs)
	}

	// The way out the hint names, pasted: raise the limit.
	tokFile := filepath.Join(t.TempDir(), "token.yaml")
	y := mustRun(t, "token", "get", "runner", "--data", e.dir, "-o", "yaml")
	if !strings.Contains(y, "limit: 1") {
		t.Fatalf("token get -o yaml:\n%s", y)
	}
	if err := os.WriteFile(tokFile, []byte(strings.Replace(y, "limit: 1", "limit: 2", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", tokFile, "--data", e.dir)
	waitFor(t, 3*time.Minute, "the agent back in a new instance", func() bool {
		select {
		case <-p.done:
			t.Fatalf("agent run exited: %v\n%s", p.exitErr, p.Logs())
		default:
		}
		return agentState(t, adir).InstanceID != instance
	})
	if n := recoveryCount(t, e.dir, "runner"); n != 2 {
		t.Fatalf("recovery_count = %d, want 2 (the first join and this recovery)", n)
	}
	p.stop(t)
}

// TestBoundKeypairNodeDeleteNamesTheToken: through the built binary,
// deleting a bound-keypair node does not stop its agent: the token is
// bound to the node, so the agent's next refresh proves its key and is
// admitted as a recovery. agents delete says so and names the way to stop
// it, muster token delete NAME, which works pasted: the agent's next
// refresh is then refused.
func TestBoundKeypairNodeDeleteNamesTheToken(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := filepath.Join(t.TempDir(), "agent")
	joinBoundKeypair(t, e, adir, "runner", "3")

	out := mustRun(t, "agents", "delete", "runner", "--data", e.dir)
	const wayOut = "To stop it for good: muster "
	_, pasted, ok := strings.Cut(strings.TrimSpace(out), wayOut)
	if !ok {
		t.Fatalf("agents delete of a bound-keypair node does not say how to stop it:\n%s", out)
	}
	// What it warns of: the agent is back at its next refresh.
	mustRun(t, "agent", "renew", "--data", adir)
	if n := recoveryCount(t, e.dir, "runner"); n != 2 {
		t.Fatalf("recovery_count = %d, want 2 (the join and the recovery after the deletion)", n)
	}

	sh := exec.Command("sh", "-c", shellword.Quote(musterBin)+" "+pasted)
	sh.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "MUSTER_DATA=" + e.dir}
	if got, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("the way out, pasted (muster %s): %v\n%s", pasted, err, got)
	}
	if msg := mustFail(t, "agent", "renew", "--data", adir); !strings.Contains(msg, "NOT_FOUND") {
		t.Fatalf("agent renew after the token's deletion: %s", msg)
	}
}
