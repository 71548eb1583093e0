package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
)

// agentState reads ADIR/state.json.
func agentState(t *testing.T, adir string) agent.State {
	t.Helper()
	st, err := agent.Dir(adir).ReadState()
	if err != nil {
		t.Fatal(err)
	}
	return *st
}

// waitLog waits for a log record of p whose msg is msg, counting from the
// n-th such record (so a second refresh can be waited for).
func waitLog(t *testing.T, p *proc, msg string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if strings.Count(p.Logs(), fmt.Sprintf(`"msg":%q`, msg)) >= n {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited waiting for %q: %v\n%s", p.name, msg, p.exitErr, p.Logs())
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatalf("%s logged no %q in %s\n%s", p.name, msg, within, p.Logs())
}

// waitExpired sleeps until the agent's certificate has expired.
func waitExpired(t *testing.T, adir string) {
	t.Helper()
	time.Sleep(time.Until(agentState(t, adir).NotAfter) + time.Second)
}

func recoveryCount(t *testing.T, dir, name string) int64 {
	t.Helper()
	return botOf(t, mustRun(t, "token", "get", name, "--data", dir, "-o", "json")).BoundKeypair.RecoveryCount
}

// TestBoundKeypairAgent: through the built binary, muster agent join
// --bound-keypair with a static key, agent run refreshing (nothing
// consumed, same instance), the agent stopped past its certificate's TTL
// and recovering on restart (a new instance, one recovery), a spent budget
// retried by agent run until token apply raises the limit; and a join with
// the registration secret in the joining URI, which makes the key and
// leaves no secret in agent.yaml.
func TestBoundKeypairAgent(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")

	adir := filepath.Join(t.TempDir(), "agent")
	pubLine, keyFile := keypairFile(t, adir)
	mustRun(t, "bot", "add", "runner", "--public-key", keyFile, "--recovery-limit", "2", "--data", e.dir)

	// A join with a token that does not exist leaves no certificate files.
	bad := filepath.Join(t.TempDir(), "bad")
	mustRun(t, "keypair", "create", "--data", bad)
	if msg := mustFail(t, "agent", "join", "--data", bad, "--bound-keypair", "nobody", "--authority", e.auth.addr,
		"--ca-fingerprint", e.fingerprint); !strings.Contains(msg, "join failed") {
		t.Fatalf("join with an unknown token: %s", msg)
	}
	assertNoAgentCerts(t, bad)

	mustRun(t, "agent", "join", "--data", adir, "--bound-keypair", "runner", "--node", "runner",
		"--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint)
	joined := agentState(t, adir)
	if joined.JoinMethod != agent.JoinMethodBoundKeypair || joined.JoinState == "" || joined.InstanceID == "" ||
		joined.RecoveriesRemaining == nil || *joined.RecoveriesRemaining != 1 {
		t.Fatalf("state.json after the join: %+v", joined)
	}
	if n := recoveryCount(t, e.dir, "runner"); n != 1 {
		t.Fatalf("recovery_count after the first join = %d, want 1", n)
	}

	// agent run refreshes at about half-life: same instance, nothing consumed.
	run := func() *proc {
		p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json",
			"--metrics-listen", "127.0.0.1:0")
		return p
	}
	p := run()
	waitLog(t, p, "refresh done", 2, 20*time.Second)
	if st := agentState(t, adir); st.InstanceID != joined.InstanceID || st.Serial == joined.Serial {
		t.Fatalf("after refreshes: instance %s (want %s), serial %s (joined %s)", st.InstanceID, joined.InstanceID, st.Serial, joined.Serial)
	}
	if n := recoveryCount(t, e.dir, "runner"); n != 1 {
		t.Fatalf("recovery_count after refreshes = %d, want 1", n)
	}
	if body := metricsOf(t, p.metrics); !strings.Contains(body, `muster_bound_keypair_recoveries_remaining{token="runner"} 1`) {
		t.Errorf("the agent's metrics lack the recoveries remaining:\n%s", body)
	}
	p.stop(t)

	// Stopped past its TTL, the agent recovers on restart.
	waitExpired(t, adir)
	p = run()
	waitLog(t, p, "recovery done", 1, 20*time.Second)
	recovered := agentState(t, adir)
	if recovered.InstanceID == joined.InstanceID || recovered.JoinState == joined.JoinState {
		t.Fatalf("recovery kept instance %s", recovered.InstanceID)
	}
	if n := recoveryCount(t, e.dir, "runner"); n != 2 {
		t.Fatalf("recovery_count after the recovery = %d, want 2", n)
	}
	if show := mustRun(t, "agents", "show", "runner", "--data", e.dir); !strings.Contains(show, recovered.InstanceID) {
		t.Errorf("agents show lacks the new instance %s:\n%s", recovered.InstanceID, show)
	}
	p.stop(t)
	// A copy of the machine, which will hold a stale join state.
	stale := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", adir, stale).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}

	// The budget is spent: agent run retries until the limit is raised.
	waitExpired(t, adir)
	p = run()
	waitLog(t, p, "recovery failed; retrying", 1, 20*time.Second)
	if !strings.Contains(p.Logs(), "recovery_exhausted") {
		t.Fatalf("the retried recovery does not say why:\n%s", p.Logs())
	}
	file := filepath.Join(t.TempDir(), "token.yaml")
	yaml := fmt.Sprintf("kind: token\nmetadata: {name: runner}\nspec:\n  join_method: bound-keypair\n  node: runner\n"+
		"  bound_keypair:\n    onboarding: {initial_public_key: %q}\n    recovery: {limit: 3, mode: standard}\n", pubLine)
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)
	// The spent budget's retries keep their own backoff (1 s doubling,
	// which the stream does not cut short): the next one comes within
	// the delay reached by now.
	waitLog(t, p, "recovery done", 1, 3*time.Minute)
	if st := agentState(t, adir); st.InstanceID == recovered.InstanceID {
		t.Fatalf("no new instance after raising the limit: %s", st.InstanceID)
	}
	p.stop(t)

	// The copy recovers with a join state the token has moved past: a
	// permanent refusal, which ends agent run with one clear line (and
	// locks the token).
	r := muster(t, nil, "agent", "run", "--data", stale, "--log-format", "json")
	if r.code == 0 || !strings.Contains(r.stderr, "muster: recovery failed: PERMISSION_DENIED") ||
		!strings.Contains(r.stderr, "join_state_mismatch") {
		t.Fatalf("agent run with a stale join state: exit %d\n%s", r.code, r.stderr)
	}

	// Registration with the secret in the joining URI: the key is made on
	// the first join, and the secret does not stay in agent.yaml.
	var reg botInfo
	if err := json.Unmarshal([]byte(mustRun(t, "bot", "add", "builder", "--data", e.dir, "-o", "json")), &reg); err != nil {
		t.Fatal(err)
	}
	adir2 := filepath.Join(t.TempDir(), "agent2")
	r = muster(t, []string{"MUSTER_JOIN_URI=" + reg.URI}, "agent", "join", "--data", adir2)
	if r.code != 0 {
		t.Fatalf("join with the URI: exit %d\n%s", r.code, r.stderr)
	}
	fi, err := os.Stat(agent.Dir(adir2).BoundKeyFile())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bound key after registration: %v %v", fi, err)
	}
	if cfg, _ := os.ReadFile(agent.Dir(adir2).ConfigFile()); strings.Contains(string(cfg), reg.BoundKeypair.RegistrationSecret) ||
		!strings.Contains(string(cfg), "bound_keypair: builder") {
		t.Fatalf("agent.yaml after registration:\n%s", cfg)
	}
	if got := botOf(t, mustRun(t, "token", "get", "builder", "--data", e.dir, "-o", "json")); got.BoundKeypair.BoundKeyFingerprint == "" {
		t.Fatalf("no key bound after registration: %+v", got)
	}

	// agent run joins an empty directory from MUSTER_JOIN_URI too.
	if err := json.Unmarshal([]byte(mustRun(t, "bot", "add", "tester", "--data", e.dir, "-o", "json")), &reg); err != nil {
		t.Fatal(err)
	}
	adir3 := filepath.Join(t.TempDir(), "agent3")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := execCommand(ctx, "agent", "run", "--data", adir3, "--log-format", "json")
	cmd.Env = append(cmd.Env, "MUSTER_JOIN_URI="+reg.URI)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !agent.Dir(adir3).HasIdentity(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("agent run did not join in 20s:\n%s", logs.String())
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent run after SIGTERM: %v\n%s", err, logs.String())
	}
	if st := agentState(t, adir3); st.JoinMethod != agent.JoinMethodBoundKeypair || st.NodeID != "tester" || st.BoundKeypair != "tester" {
		t.Fatalf("state.json after agent run joined: %+v", st)
	}
}
