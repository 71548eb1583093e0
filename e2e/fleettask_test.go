package e2e

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLabelTaskReachesAFleet: a label matching more nodes than one signed
// task may name (1,024) is sent as one task per page of nodes, each
// signed with its own list, queued all at once; a running agent among the
// matching nodes, named in the last page, verifies and answers its task,
// and a node joined with another label is not sent one. Before, the send
// was refused ("target too large").
func TestLabelTaskReachesAFleet(t *testing.T) {
	t.Parallel()
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

	var sent sendAnswer
	if err := json.Unmarshal([]byte(mustRun(t, "task", "send", "--data", dir, "--type", "node.report", "--label", "pool=gpu", "-o", "json")), &sent); err != nil {
		t.Fatal(err)
	}
	// 1,501: the seeded 1,500 and zz-gpu, not zz-web. The answer lists the
	// first 1,000 and counts the rest.
	if sent.NodeCount != 1501 || len(sent.NodeIDs) != 1000 || sent.MoreNodes != 501 || len(sent.TaskIDs) != 2 || sent.TaskIDs[0] != sent.TaskID {
		t.Fatalf("task send --label pool=gpu: %+v nodes (%d listed) in %d tasks (first %s, task_id %s); want 1,501 nodes, 1,000 listed, in 2 tasks",
			sent.NodeCount, len(sent.NodeIDs), len(sent.TaskIDs), sent.TaskIDs[0], sent.TaskID)
	}
	last := sent.TaskIDs[1]
	waitFor(t, agentReach, "zz-gpu answers the task of the last page", func() bool {
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
	var fleet []struct {
		Node string `json:"node"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "agents", "list", "--data", dir, "-o", "json")), &fleet); err != nil {
		t.Fatal(err)
	}
	args := []string{"task", "send", "--data", dir, "--type", "node.report", "-o", "json", "--node", "zz-gpu"}
	for _, a := range fleet[:1099] {
		args = append(args, "--node", a.Node)
	}
	args = append(args, "--node", "zz-gpu")
	var listed sendAnswer
	if err := json.Unmarshal([]byte(mustRun(t, args...)), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.TaskIDs) != 2 || listed.NodeCount != 1100 {
		t.Errorf("task send with zz-gpu named twice among 1,099 others: %d tasks to %d nodes; want 2 tasks to 1,100 (zz-gpu once)", len(listed.TaskIDs), listed.NodeCount)
	}
	// The table form names every task.
	text := mustRun(t, "task", "send", "--data", dir, "--type", "node.report", "--label", "pool=gpu")
	if !strings.Contains(text, "2 tasks (node.report), one per page of nodes") || !strings.Contains(text, "queued for 1501 nodes") ||
		strings.Count(text, "\n  ") != 2 {
		t.Errorf("task send prints:\n%s", text)
	}

	// --all: one task, queued for every node a page at a time; the answer
	// counts them all and lists the first 1,000 (before, it listed all).
	var all sendAnswer
	if err := json.Unmarshal([]byte(mustRun(t, "task", "send", "--data", dir, "--type", "node.report", "--all", "-o", "json")), &all); err != nil {
		t.Fatal(err)
	}
	if all.NodeCount != 1702 || len(all.NodeIDs) != 1000 || all.MoreNodes != 702 || len(all.TaskIDs) != 1 || all.TaskID != all.TaskIDs[0] {
		t.Fatalf("task send --all: %d nodes, %d listed, %d more, tasks %v; want 1,702 nodes, 1,000 listed, 702 more, one task",
			all.NodeCount, len(all.NodeIDs), all.MoreNodes, all.TaskIDs)
	}
	if !slices.IsSorted(all.NodeIDs) || all.NodeIDs[0] != fleet[0].Node {
		t.Errorf("task send --all lists %s… ; want the first nodes by ID, from %s", all.NodeIDs[0], fleet[0].Node)
	}
	// Both agents, last by ID, are among the nodes not listed: queued all
	// the same.
	for n := range agents {
		waitFor(t, agentReach, n+" answers the task to all", func() bool {
			return results(t, dir, all.TaskID)[n].Result == "ok"
		})
	}
}

// sendAnswer is task send -o json.
type sendAnswer struct {
	TaskID    string   `json:"task_id"`
	TaskIDs   []string `json:"task_ids"`
	NodeIDs   []string `json:"node_ids"`
	NodeCount int      `json:"node_count"`
	MoreNodes int      `json:"more_nodes"`
}
