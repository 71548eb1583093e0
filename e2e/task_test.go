package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type auditRec struct {
	Action string `json:"action"`
	Actor  string `json:"actor"`
	Target string `json:"target"`
	Result string `json:"result"`
	Reason string `json:"reason"`
}

func auditOf(t *testing.T, dir, action string) []auditRec {
	t.Helper()
	var recs []auditRec
	if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "--action", action, "-o", "json")), &recs); err != nil {
		t.Fatal(err)
	}
	return recs
}

// results maps node -> audit result reason of one task.
func results(t *testing.T, dir, taskID string) map[string]auditRec {
	m := map[string]auditRec{}
	for _, r := range auditOf(t, dir, "task.result") {
		if r.Target == taskID {
			m[r.Actor[strings.LastIndex(r.Actor, "/")+1:]] = r
		}
	}
	return m
}

// TestTaskRotationAcrossAgents stages a signer while two of three agents
// run and the third is offline: the running ones take the signed
// node.rotate_signing_key at once, the third when it connects. Then a
// report and a custom task go out, the custom one running only where a
// handler is configured.
func TestTaskRotationAcrossAgents(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	dirs := map[string]string{}
	for _, n := range []string{"a1", "a2", "a3"} {
		dirs[n] = filepath.Join(t.TempDir(), n)
		if r := muster(t, nil, "agent", "join", "--data", dirs[n], "--node", n, e.createToken(t).URI); r.code != 0 {
			t.Fatalf("join %s: %s", n, r.stderr)
		}
	}
	for _, n := range []string{"a1", "a2"} {
		startProc(t, n, "stream to the authority open", "agent", "run", "--data", dirs[n], "--log-format", "json")
	}
	mustRun(t, "signer", "stage", "--data", e.dir, "--effective-in", "15m")
	var rotate string
	for _, r := range auditOf(t, e.dir, "task.send") {
		if strings.Contains(r.Target, "node.rotate_signing_key") && strings.Contains(r.Target, "to 3 nodes") {
			rotate = strings.Fields(r.Target)[1]
		}
	}
	if rotate == "" {
		t.Fatalf("no rotate task queued for 3 nodes: %+v", auditOf(t, e.dir, "task.send"))
	}
	took := waitFor(t, agentReach, "the running agents take the rotate task", func() bool {
		res := results(t, e.dir, rotate)
		return res["a1"].Result == "ok" && res["a2"].Result == "ok"
	})
	t.Logf("rotate task answered by the two running agents in %s", took)
	for _, n := range []string{"a1", "a2"} {
		st := agentStatus(t, dirs[n])
		if st["last_rotate_task"] != rotate || acceptedByNumber(st)["v2"] != "staged" {
			t.Errorf("%s after the rotate task: %v %v", n, st["last_rotate_task"], st["accepted_signers"])
		}
	}
	if _, ok := results(t, e.dir, rotate)["a3"]; ok {
		t.Fatal("the offline agent answered")
	}

	// The offline agent catches up when it connects.
	startProc(t, "a3", "stream to the authority open", "agent", "run", "--data", dirs["a3"], "--log-format", "json")
	waitFor(t, agentReach, "the offline agent takes the rotate task on connect", func() bool {
		return results(t, e.dir, rotate)["a3"].Result == "ok"
	})
	if st := agentStatus(t, dirs["a3"]); st["last_rotate_task"] != rotate {
		t.Errorf("a3 last rotate task = %v", st["last_rotate_task"])
	}

	var sent struct {
		TaskID  string   `json:"task_id"`
		NodeIDs []string `json:"node_ids"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "task", "send", "--data", e.dir, "--type", "node.report", "--node", "a1", "-o", "json")), &sent); err != nil || len(sent.NodeIDs) != 1 {
		t.Fatalf("task send: %+v %v", sent, err)
	}
	if want := "task " + sent.TaskID + " node.report to 1 node"; !slices.ContainsFunc(auditOf(t, e.dir, "task.send"), func(r auditRec) bool { return r.Target == want }) {
		t.Errorf("no task.send audited as %q: %+v", want, auditOf(t, e.dir, "task.send"))
	}
	waitFor(t, agentReach, "node.report answered", func() bool {
		r := results(t, e.dir, sent.TaskID)["a1"]
		return r.Result == "ok" && strings.Contains(r.Reason, `"node_id":"a1"`)
	})

	handler := filepath.Join(t.TempDir(), "echo.sh")
	if err := os.WriteFile(handler, []byte("#!/bin/sh\necho handled; cat\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs["a3"], "task-handlers.yaml"), []byte("handlers:\n  site.echo: "+handler+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(mustRun(t, "task", "send", "--data", e.dir, "--type", "site.echo", "--all", "--param", "msg=hi", "-o", "json")), &sent); err != nil {
		t.Fatal(err)
	}
	waitFor(t, agentReach, "the custom task answered by every agent", func() bool { return len(results(t, e.dir, sent.TaskID)) == 3 })
	res := results(t, e.dir, sent.TaskID)
	if r := res["a3"]; r.Result != "ok" || !strings.Contains(r.Reason, "handled\n{\"msg\":\"hi\"}") {
		t.Errorf("a3 ran the handler: %+v", r)
	}
	for _, n := range []string{"a1", "a2"} {
		if r := res[n]; r.Result != "denied" || !strings.Contains(r.Reason, "refused by signer v1: no_handler") {
			t.Errorf("%s without a handler: %+v", n, r)
		}
	}
	waitFor(t, agentReach, "agents show reports a1's refusal by signer and its rotate task", func() bool {
		out := mustRun(t, "agents", "show", "a1", "--data", e.dir)
		return strings.Contains(out, "Task verification failures by signer: v1: 1") && strings.Contains(out, "Last rotate task: "+rotate)
	})
	if msg := mustFail(t, "task", "send", "--data", e.dir, "--type", "node.rotate_signing_key", "--all"); !strings.Contains(msg, "INVALID_ARGUMENT") {
		t.Errorf("rotate task by hand: %q", msg)
	}
	if msg := mustFail(t, "task", "send", "--data", e.dir, "--type", "node.report", "--node", "nope"); !strings.Contains(msg, "NOT_FOUND") || !strings.Contains(msg, "no node nope") ||
		!strings.Contains(msg, "`muster agents list`") {
		t.Errorf("unknown node: %q, want NOT_FOUND naming muster agents list", msg)
	}
	if msg := mustFail(t, "task", "send", "--data", e.dir, "--type", "node.report", "--label", "role=none"); !strings.Contains(msg, "FAILED_PRECONDITION") ||
		!strings.Contains(msg, "`muster token list`") {
		t.Errorf("a label no token carries: %q, want FAILED_PRECONDITION naming muster token list", msg)
	}
	if m := metricsOf(t, e.auth.metrics); !strings.Contains(m, `muster_task_verification_failures_total{reason="no_handler",signer="v1"} 2`) {
		t.Errorf("refusals by signer:\n%s", grepLines(m, "muster_task_verification_failures_total"))
	}
}
