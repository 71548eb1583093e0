package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestIntermediatesRotateUnderARunningAgent: with --ca-intermediate-ttl 2m
// (the floor) the authority rotates its agent and server intermediates by
// itself, twice in under three minutes, while an agent with 10-second
// certificates renews all along: no renewal is refused, its last
// certificate comes from the newest agent intermediate, and openssl checks
// it against the root. It waits for two rotations: about 3 minutes.
func TestIntermediatesRotateUnderARunningAgent(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--ca-intermediate-ttl", "2m", "--agent-cert-ttl", "10s")
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := execCommand(ctx, "agent", "run", "--data", adir, "--log-format", "json")
	cmd.Env = append(cmd.Env, "MUSTER_JOIN_URI="+tok.URI, "MUSTER_NODE_ID=rotating")
	logs := &syncWriter{w: &strings.Builder{}}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()

	type rec struct {
		Action string `json:"action"`
		Target string `json:"target"`
	}
	activations := func() map[string]int {
		var recs []rec
		out := mustRun(t, "audit", "list", "--data", e.dir, "--action", "ca.activate", "-o", "json")
		if err := json.Unmarshal([]byte(out), &recs); err != nil {
			t.Fatalf("audit list -o json printed %q: %v", out, err)
		}
		n := map[string]int{}
		for _, r := range recs {
			role, _, _ := strings.Cut(r.Target, "/")
			n[role]++
		}
		return n
	}
	deadline := time.Now().Add(4 * time.Minute)
	for n := activations(); n["agent"] < 2 || n["server"] < 2; n = activations() {
		if time.Now().After(deadline) {
			t.Fatalf("activations after 4 minutes: %v, want two of the agent and server intermediates\nagent log:\n%s", n, logs.String())
		}
		time.Sleep(2 * time.Second)
	}
	// A renewal or two under the newest intermediate.
	time.Sleep(12 * time.Second)

	metrics := metricsOf(t, e.auth.metrics)
	renewed := false
	for _, m := range regexp.MustCompile(`(?m)^muster_renewals_total\{result="([a-z_]+)"\} (\d+)`).FindAllStringSubmatch(metrics, -1) {
		switch {
		case m[1] == "ok":
			renewed = m[2] != "0"
		case m[2] != "0":
			t.Errorf("renewals refused during the rotations: %s", m[0])
		}
	}
	if !renewed {
		t.Fatalf("no renewal counted:\n%s", metrics)
	}
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("the agent logged errors:\n%s", logs.String())
	}

	// The agent's certificate chains through the newest agent
	// intermediate to the root.
	root := filepath.Join(e.dir, "ca", "root.crt")
	leaf := filepath.Join(adir, "certs", "agent.crt")
	out, err := exec.Command("openssl", "verify", "-CAfile", root, "-untrusted", leaf, "-purpose", "sslclient", leaf).CombinedOutput()
	if err != nil || !strings.Contains(string(out), ": OK") {
		t.Fatalf("openssl verify: %v\n%s", err, out)
	}
	pem, err := os.ReadFile(leaf)
	if err != nil {
		t.Fatal(err)
	}
	// The init-time agent intermediate no longer signs: the chain's
	// intermediate differs from ca/agent.crt.
	fileInter, _ := os.ReadFile(filepath.Join(e.dir, "ca", "agent.crt"))
	if strings.Contains(string(pem), strings.TrimSpace(string(fileInter))) {
		t.Fatal("the agent's chain still carries the init-time agent intermediate after two rotations")
	}
}
