package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRenewalsPerLifetime: through the binary, with
// --renewals-per-lifetime 3 (certificates of an hour: nothing refills
// during the test), an agent renews three times by hand; the fourth
// renewal is refused RESOURCE_EXHAUSTED with the setting named and the
// agent's identity kept, and audited; a re-join of the node (a new
// instance) renews again. And with the default, an agent run on 10 s
// certificates renews at half-life, again and again, never refused.
// Before, an agent certificate renewed as often as its holder asked.
func TestRenewalsPerLifetime(t *testing.T) {
	t.Parallel()
	t.Run("refused past the allowance", func(t *testing.T) {
		t.Parallel()
		e := newAgentEnv(t, "--renewals-per-lifetime", "3", "--agent-cert-ttl", "1h")
		if !strings.Contains(e.auth.Logs(), `"renewals_per_lifetime":3`) {
			t.Errorf("the start log does not name the allowance:\n%s", e.auth.Logs())
		}
		adir := filepath.Join(t.TempDir(), "agent")
		mustRun(t, "agent", "join", "--data", adir, "--node", "n1", e.createToken(t).URI)
		for range 3 {
			mustRun(t, "agent", "renew", "--data", adir)
		}
		line := mustFail(t, "agent", "renew", "--data", adir)
		if !strings.Contains(line, "RESOURCE_EXHAUSTED") || !strings.Contains(line, "raise limits.renewals_per_lifetime") {
			t.Errorf("a fourth renewal within the lifetime: %q, want RESOURCE_EXHAUSTED naming limits.renewals_per_lifetime", line)
		}
		if st := agentStatus(t, adir); st["generation"] != 3.0 {
			t.Errorf("after the refusal the agent holds generation %v, want 3 (kept)", st["generation"])
		}
		var recs []map[string]any
		json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", e.dir, "-o", "json", "--action", "agent.renew")), &recs)
		var found bool
		for _, r := range recs {
			reason, _ := r["reason"].(string)
			found = found || r["result"] == "denied" && strings.Contains(reason, "limits.renewals_per_lifetime") &&
				strings.Contains(reason, "more than 3 renewals in a certificate lifetime of 1h0m0s")
		}
		if !found {
			t.Errorf("the refusal is not audited with its reason: %v", recs)
		}
		// A re-join with a token bound to the node is a new instance.
		mustRun(t, "agent", "join", "--data", adir, "--node", "n1", "--force", e.createToken(t, "--node", "n1").URI)
		mustRun(t, "agent", "renew", "--data", adir)
	})
	t.Run("half-life renewals of 10 s certificates", func(t *testing.T) {
		t.Parallel()
		e := newAgentEnv(t, "--agent-cert-ttl", "10s")
		adir := filepath.Join(t.TempDir(), "agent")
		mustRun(t, "agent", "join", "--data", adir, "--node", "n2", e.createToken(t).URI)
		// By hand a few times first, as an operator might.
		for range 3 {
			mustRun(t, "agent", "renew", "--data", adir)
		}
		run, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json", "--metrics-listen", "")
		// Eight renewals at about 5 s each, eleven in all: past the
		// default's 10 at once, so the refill decides.
		waitFor(t, 3*time.Minute, "the agent renews 8 times by itself", func() bool {
			g, _ := agentStatus(t, adir)["generation"].(float64)
			return g >= 11
		})
		if strings.Contains(run.Logs(), "RESOURCE_EXHAUSTED") {
			t.Errorf("a half-life renewal was refused:\n%s", run.Logs())
		}
	})
}
