package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLabelTaskReachesAFleet: a label matching more nodes than one signed
// task may name (1,024) is sent as one task per page of nodes, each
// signed with its own list, queued all at once; a running agent among the
// matching nodes, named in the last page, verifies and answers its task,
// and a node joined with another label is not sent one. Before, the send
// was refused ("target too large").
func TestLabelTaskReachesAFleet(t *testing.T) {
	dir, out := initDir(t)
	for _, seed := range [][]string{{"--tokens", "1500", "--nodes", "1500", "--label", "pool=gpu"}, {"--tokens", "200", "--nodes", "200", "--label", "pool=web"}} {
		if r := muster(t, nil, append([]string{"bench", "seed", "--data", dir}, seed...)...); r.code != 0 {
			t.Fatalf("bench seed %v: exit %d\n%s", seed, r.code, r.stderr)
		}
	}
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir)}
	e.authorityID, _ = out["authority_id"].(string)
	e.fingerprint, _ = out["ca_fingerprint"].(string)
	agents := map[string]string{"zz-gpu": "pool=gpu", "zz-web": "pool=web"}
	for n, label := range agents {
		adir := filepath.Join(t.TempDir(), n)
		if r := muster(t, nil, "agent", "join", "--data", adir, "--node", n, e.createToken(t, "--label", label).URI); r.code != 0 {
			t.Fatalf("join %s: %s", n, r.stderr)
		}
		startProc(t, n, "stream to the authority open", "agent", "run", "--data", adir, "--log-format", "json")
	}

	var sent struct {
		TaskID  string   `json:"task_id"`
		TaskIDs []string `json:"task_ids"`
		NodeIDs []string `json:"node_ids"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "task", "send", "--data", dir, "--type", "node.report", "--label", "pool=gpu", "-o", "json")), &sent); err != nil {
		t.Fatal(err)
	}
	if len(sent.NodeIDs) != 1501 || len(sent.TaskIDs) != 2 || sent.TaskIDs[0] != sent.TaskID {
		t.Fatalf("task send --label pool=gpu: %d nodes in %d tasks (first %s, task_id %s); want 1,501 nodes in 2 tasks",
			len(sent.NodeIDs), len(sent.TaskIDs), sent.TaskIDs[0], sent.TaskID)
	}
	for _, n := range sent.NodeIDs {
		if n == "zz-web" {
			t.Fatal("the node joined with pool=web was selected")
		}
	}
	last := sent.TaskIDs[1]
	waitFor(t, 15*time.Second, "zz-gpu answers the task of the last page", func() bool {
		return results(t, dir, last)["zz-gpu"].Result == "ok"
	})
	if r, ok := results(t, dir, sent.TaskIDs[0])["zz-gpu"]; ok {
		t.Errorf("zz-gpu answered the first page's task, which does not name it: %+v", r)
	}
	var send []auditRec
	for _, r := range auditOf(t, dir, "task.send") {
		if strings.Contains(r.Target, "node.report") {
			send = append(send, r)
		}
	}
	if len(send) != 1 || !strings.Contains(send[0].Target, "(2, one per page of nodes) node.report to 1501 nodes") {
		t.Errorf("task.send audit records: %+v; want one naming the 2 tasks and 1501 nodes", send)
	}
	// A --node list past one task's worth, naming zz-gpu twice (first and
	// last, so two pages would each name it): zz-gpu is queued once.
	args := []string{"task", "send", "--data", dir, "--type", "node.report", "-o", "json", "--node", "zz-gpu"}
	for _, n := range sent.NodeIDs[:1100] {
		if n != "zz-gpu" {
			args = append(args, "--node", n)
		}
	}
	args = append(args, "--node", "zz-gpu")
	var listed struct {
		TaskIDs []string `json:"task_ids"`
		NodeIDs []string `json:"node_ids"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, args...)), &listed); err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, n := range listed.NodeIDs {
		if n == "zz-gpu" {
			named++
		}
	}
	if len(listed.TaskIDs) != 2 || named != 1 {
		t.Errorf("task send with zz-gpu named twice among %d nodes: %d tasks, zz-gpu queued %d times; want 2 tasks, once", len(listed.NodeIDs), len(listed.TaskIDs), named)
	}
	// The table form names every task.
	text := mustRun(t, "task", "send", "--data", dir, "--type", "node.report", "--label", "pool=gpu")
	if !strings.Contains(text, "2 tasks (node.report), one per page of nodes") || strings.Count(text, "\n  ") != 2 {
		t.Errorf("task send prints:\n%s", text)
	}
}
