package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestRefusedNodeNameAuditedOnce: agents delete and lock create --node of
// a name that is no node name, and agents delete of a node that is not
// enrolled, are each refused once, saying what is wrong, and audited by
// one denied record of what the operator asked for. Before, agents delete
// of a bad name also left a denied agent.get, from the read the command
// makes before deleting (walked: two records for one refusal), and the
// refusal called the name an "invalid SPIFFE ID".
func TestRefusedNodeNameAuditedOnce(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)
	for _, c := range []struct {
		args         []string
		target, want string
		action       string
	}{
		{[]string{"agents", "delete", "Web_1"}, "Web_1", `node "Web_1" is not a valid node name: it has the capital 'W'`, "agent.delete"},
		{[]string{"agents", "delete", "ghost"}, "ghost", `no node "ghost"`, "agent.delete"},
		{[]string{"lock", "create", "--node", "web_1"}, "node:web_1", `lock node target "web_1" is not a valid node name: it has '_'`, "lock.create"},
	} {
		line := mustFail(t, append(c.args, "--data", dir)...)
		if !strings.Contains(line, c.want) || strings.Contains(line, "SPIFFE") {
			t.Errorf("muster %s: %q, want %q", strings.Join(c.args, " "), line, c.want)
		}
		var recs []struct{ Action, Target, Result, Reason string }
		if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "-o", "json")), &recs); err != nil {
			t.Fatal(err)
		}
		var about []string
		for _, r := range recs {
			if r.Target == c.target {
				about = append(about, r.Action+"/"+r.Result+": "+r.Reason)
			}
		}
		if len(about) != 1 || !strings.HasPrefix(about[0], c.action+"/denied: ") || !strings.Contains(about[0], c.want) {
			t.Errorf("muster %s: audited %q, want one %s denied record saying %q", strings.Join(c.args, " "), about, c.action, c.want)
		}
	}
}
