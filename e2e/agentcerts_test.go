package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// agentCertCount matches one muster_agent_certificates series.
var agentCertCount = regexp.MustCompile(`(?m)^muster_agent_certificates\{state="(\w+)"\} (\d+)$`)

// agentCertCounts is the authority's muster_agent_certificates by state,
// as a string "valid=N expiring=N expired=N" ("" before the first count).
func agentCertCounts(t *testing.T, addr string) string {
	t.Helper()
	got := map[string]string{}
	for _, m := range agentCertCount.FindAllStringSubmatch(metricsOf(t, addr), -1) {
		got[m[1]] = m[2]
	}
	if len(got) == 0 {
		return ""
	}
	return fmt.Sprintf("valid=%s expiring=%s expired=%s", got["valid"], got["expiring"], got["expired"])
}

// TestAgentCertificatesMetric: with 20-second certificates, an agent
// that joined and never renews is counted valid, then expired, on the
// authority's /metrics, while one that runs (and renews at half-life)
// stays valid: a node going dark shows without scraping its agent.
func TestAgentCertificatesMetric(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "20s")
	waitFor := func(what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			got := agentCertCounts(t, e.auth.metrics)
			if ok(got) {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("muster_agent_certificates is %q 90 s on; want %s", got, what)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	waitFor("no node counted", func(got string) bool { return got == "valid=0 expiring=0 expired=0" })

	// One that joins and stops: no renewal.
	dark := filepath.Join(t.TempDir(), "dark")
	if r := muster(t, nil, "agent", "join", "--data", dark, "--node", "dark", e.createToken(t).URI); r.code != 0 {
		t.Fatalf("agent join: exit %d\n%s", r.code, r.stderr)
	}
	// Counted once, in whichever state the count found it.
	waitFor("the joined node counted", func(got string) bool {
		return got == "valid=1 expiring=0 expired=0" || got == "valid=0 expiring=1 expired=0" || got == "valid=0 expiring=0 expired=1"
	})

	// One that runs, renewing at half its lifetime.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := execCommand(ctx, "agent", "run", "--data", filepath.Join(t.TempDir(), "live"), "--log-format", "json")
	cmd.Env = append(cmd.Env, "MUSTER_JOIN_URI="+e.createToken(t).URI, "MUSTER_NODE_ID=live")
	logs := &syncWriter{w: &strings.Builder{}}
	logsOnFailure(t, "agent", logs.String)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	waitFor("the dark node expired and the live one valid", func(got string) bool { return got == "valid=1 expiring=0 expired=1" })

	// Deleting the dark node takes it out of the counts.
	mustRun(t, "agents", "delete", "dark", "--data", e.dir)
	waitFor("the deleted node no longer counted", func(got string) bool { return got == "valid=1 expiring=0 expired=0" })
}
