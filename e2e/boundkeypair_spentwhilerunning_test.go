package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A bound-keypair agent running while the authority is away past its
// certificate's expiry recovers when the authority is back; with the
// token's budget spent, it retries recovery_exhausted until token apply
// raises the limit, as an agent started with an expired certificate does
// (docs/operator-guide.md). Before, the refusal met in the refresh's
// retries ended agent run ("permanent failure").
func TestBoundKeypairRunningAgentWaitsOutASpentBudget(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "6s")
	addr := e.auth.addr
	adir := filepath.Join(t.TempDir(), "spent")
	// The join takes the only recovery.
	pubLine := joinBoundKeypair(t, e, adir, "spent", "1")
	p, _ := startProc(t, "agent", "agent started", "agent", "run", "--data", adir, "--log-format", "json")
	waitLog(t, p, "refresh done", 1, 30*time.Second)

	e.auth.stop(t)
	waitLog(t, p, "renewal failed; retrying", 1, 30*time.Second)
	waitExpired(t, adir)
	e.auth = startAuthority(t, e.dir, "--listen", addr, "--agent-cert-ttl", "6s")
	waitFor(t, 60*time.Second, "recovery_exhausted after the authority's return", func() bool {
		select {
		case <-p.done:
			t.Fatalf("agent run ended on a spent budget:\n%s", p.Logs())
		default:
		}
		return strings.Contains(p.Logs(), "recovery_exhausted")
	})

	file := filepath.Join(t.TempDir(), "token.yaml")
	yaml := fmt.Sprintf("kind: token\nmetadata: {name: spent}\nspec:\n  join_method: bound-keypair\n  node: spent\n"+
		"  bound_keypair:\n    onboarding: {initial_public_key: %q}\n    recovery: {limit: 2, mode: standard}\n", pubLine)
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "token", "apply", "-f", file, "--data", e.dir)
	waitLog(t, p, "recovery done", 1, 5*time.Minute+30*time.Second)
}
