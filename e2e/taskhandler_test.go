package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sendTask runs task send -o json and returns the task ID.
func sendTask(t *testing.T, dir string, args ...string) string {
	t.Helper()
	var sent struct {
		TaskID string `json:"task_id"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, append([]string{"task", "send", "--data", dir, "-o", "json"}, args...)...)), &sent); err != nil || sent.TaskID == "" {
		t.Fatalf("task send %v: %+v %v", args, sent, err)
	}
	return sent.TaskID
}

// TestTaskHandlerHungWithChild: a handler that hangs after starting a
// child that holds its output (`sleep 600 &`) delays no other task type —
// a node.report sent after it is answered while it runs — and is answered
// at its time limit, its child killed with it (before, tasks ran inline in
// the stream's receive loop, and the answer waited for the child's end).
func TestTaskHandlerHungWithChild(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	adir := filepath.Join(t.TempDir(), "h1")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "h1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("join: %s", r.stderr)
	}
	work := t.TempDir()
	pidFile := filepath.Join(work, "child.pid")
	hang := filepath.Join(work, "hang.sh")
	if err := os.WriteFile(hang, []byte("#!/bin/sh\necho started\nsleep 600 &\necho $! > "+pidFile+"\nsleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const limit = 10 * time.Second
	if err := os.WriteFile(filepath.Join(adir, "task-handlers.yaml"),
		[]byte("handlers:\n  site.hang: {path: "+hang+", timeout: "+limit.String()+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")

	sent := time.Now()
	hangID := sendTask(t, e.dir, "--type", "site.hang", "--node", "h1")
	reportID := sendTask(t, e.dir, "--type", "node.report", "--node", "h1")
	waitFor(t, limit, "node.report behind the hung handler answered", func() bool {
		return results(t, e.dir, reportID)["h1"].Result == "ok"
	})
	if r, ok := results(t, e.dir, hangID)["h1"]; ok {
		t.Fatalf("the hung handler was answered before its limit: %+v", r)
	}
	t.Logf("node.report answered %s after the hung task was sent", time.Since(sent).Round(time.Millisecond))

	// Answered at the limit (plus delivery), never when the child ends.
	waitFor(t, limit+20*time.Second, "the hung handler answered at its limit", func() bool {
		_, ok := results(t, e.dir, hangID)["h1"]
		return ok
	})
	t.Logf("the hung handler was answered %s after it was sent (limit %s)", time.Since(sent).Round(time.Millisecond), limit)
	r := results(t, e.dir, hangID)["h1"]
	if r.Result != "denied" || !strings.Contains(r.Reason, "killed at its time limit of 10s") || !strings.Contains(r.Reason, "started") {
		t.Fatalf("the hung handler's answer: %+v", r)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	waitFor(t, 5*time.Second, "the handler's child killed with it", func() bool {
		return pid > 0 && syscall.Kill(pid, 0) != nil
	})
}

// TestTaskHandlerEnvironment: a handler runs with a clean environment —
// the allow-list and the task's ID and type (and variables its entry
// names: TestHandlerEnv) — so the agent's MUSTER_BOOTSTRAP_PSK never reaches it, nor its output,
// nor the task.result audit record (before, handlers inherited the agent's
// whole environment).
func TestTaskHandlerEnvironment(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	initPSK := showPSKs(t, e.dir).Active.PSK
	adir := filepath.Join(t.TempDir(), "env1")
	// The agent is deployed with its join settings in its environment,
	// and keeps them there: a systemd unit or a pod spec does.
	env := []string{"MUSTER_AGENT_DATA=" + adir, "MUSTER_BOOTSTRAP_PSK=" + initPSK, "MUSTER_CA_FINGERPRINT=" + e.fingerprint,
		"MUSTER_AUTHORITY=" + e.auth.addr, "MUSTER_NODE_ID=env1", "SITE_REGION=eu-west", "SITE_SECRET=not-for-handlers", "HOME=" + t.TempDir()}
	if r := muster(t, env, "agent", "join"); r.code != 0 {
		t.Fatalf("PSK join: %s", r.stderr)
	}
	handler := filepath.Join(t.TempDir(), "env.sh")
	if err := os.WriteFile(handler, []byte("#!/bin/sh\nenv | sort\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(adir, "task-handlers.yaml"),
		[]byte("handlers:\n  site.env: "+handler+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startProcEnv(t, "agent", "stream to the authority open", env, "agent", "run", "--log-format", "json")

	id := sendTask(t, e.dir, "--type", "site.env", "--node", "env1")
	waitFor(t, agentReach, "the env handler answered", func() bool { return results(t, e.dir, id)["env1"].Result != "" })
	r := results(t, e.dir, id)["env1"]
	if r.Result != "ok" {
		t.Fatalf("the env handler: %+v", r)
	}
	for _, want := range []string{"MUSTER_TASK_ID=" + id, "MUSTER_TASK_TYPE=site.env", "PATH=", "HOME="} {
		if !strings.Contains(r.Reason, want) {
			t.Errorf("the handler's environment lacks %s:\n%s", want, r.Reason)
		}
	}
	for _, leak := range []string{"MUSTER_BOOTSTRAP_PSK", initPSK, initPSK[strings.LastIndex(initPSK, ":")+1:], "MUSTER_AGENT_DATA", "MUSTER_AUTHORITY=", "SITE_SECRET", "SITE_REGION"} {
		if strings.Contains(r.Reason, leak) {
			t.Errorf("the handler's environment has %q:\n%s", leak, r.Reason)
		}
	}
	// The whole audit chain, not just this record.
	if out := mustRun(t, "audit", "list", "--data", e.dir, "-o", "json"); strings.Contains(out, initPSK[strings.LastIndex(initPSK, ":")+1:]) {
		t.Error("the bootstrap PSK is in the audit log")
	}
}

// TestTaskAnsweredAcrossStreams: a task still running when its stream
// closes (the agent's 6-second certificates close it each time they
// expire) is sent again by the authority on the agent's next stream. The
// agent does not run it again, nor answer it replayed: it answers once,
// when it ends, and that answer is the one recorded. (Before, the
// redelivery was answered replayed at once, recorded as the task's answer,
// and the real one dropped: a node.report sent as certificates renewed
// could be recorded refused.)
func TestTaskAnsweredAcrossStreams(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")
	adir := filepath.Join(t.TempDir(), "slow1")
	if r := muster(t, nil, "agent", "join", "--data", adir, "--node", "slow1", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("agent join: exit %d\n%s", r.code, r.stderr)
	}
	// The handler runs until the test opens its gate, and counts its runs.
	work := t.TempDir()
	gate, runs := filepath.Join(work, "gate"), filepath.Join(work, "runs")
	handler := filepath.Join(work, "slow.sh")
	if err := os.WriteFile(handler, []byte("#!/bin/sh\necho run >> "+runs+"\nwhile [ ! -e "+gate+" ]; do sleep 0.1; done\necho slept\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(adir, "task-handlers.yaml"), []byte("handlers:\n  site.slow: "+handler+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ag, _ := startProc(t, "agent", "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")

	id := sendTask(t, e.dir, "--type", "site.slow", "--node", "slow1")
	// Its stream closes with its certificate and the next one brings the
	// task again while it runs.
	waitFor(t, agentReach, "the task sent again on a new stream while it runs", func() bool {
		l := grepLines(ag.Logs(), id)
		return strings.Contains(l, "task sent again while it runs") || strings.Contains(l, `"msg":"task refused"`)
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var r auditRec
	waitFor(t, agentReach, "the slow task answered", func() bool {
		r = results(t, e.dir, id)["slow1"]
		return r.Result != ""
	})
	if r.Result != "ok" || !strings.Contains(r.Reason, "slept") {
		t.Fatalf("the task that ran across two streams is recorded %+v, want ok with its output", r)
	}
	if got, err := os.ReadFile(runs); err != nil || string(got) != "run\n" {
		t.Errorf("the handler ran %q (%v), want once", got, err)
	}
}
