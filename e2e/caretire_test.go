package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestIntermediatesRotateAndRetireUnderARunningAgent: with
// --ca-intermediate-ttl 2m (the floor) and 10-second agent certificates,
// the authority rotates its agent and server intermediates by itself: an
// intermediate the leader prepared is seen by muster ca status -o json
// going prepared → active → retiring → retired (retiring once its own
// successor is active, so each role rotated twice; retired at its own
// not-after: an intermediate of a 2-minute life retires long before the 7
// days of the longest agent leaf), its key custody then "destroyed" and
// its ca.destroy_key record saying the key was destroyed, while a running
// agent renews throughout with no refusal; openssl verifies the agent's
// last certificate against the root, and it no longer chains through the
// init-time intermediate. About 3.5 minutes, mostly idle.
func TestIntermediatesRotateAndRetireUnderARunningAgent(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--ca-intermediate-ttl", "2m", "--agent-cert-ttl", "10s")
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	cmd := execCommand(ctx, "agent", "run", "--data", adir, "--log-format", "json")
	cmd.Env = append(cmd.Env, "MUSTER_JOIN_URI="+tok.URI, "MUSTER_NODE_ID=retiring")
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

	type cert struct {
		Kind       string `json:"kind"`
		Role       string `json:"role"`
		State      string `json:"state"`
		Serial     string `json:"serial"`
		KeyCustody string `json:"key_custody"`
	}
	// seen[role/serial] is the states observed, in order, without repeats.
	seen := map[string][]string{}
	custodyOf := map[string]string{}
	initial := map[string]bool{}
	want := []string{"prepared", "active", "retiring", "retired"}
	done := func(role string) string {
		for k, states := range seen {
			if strings.HasPrefix(k, role+"/") && !initial[k] && slices.Equal(states, want) {
				return k
			}
		}
		return ""
	}
	first := true
	deadline := time.Now().Add(6 * time.Minute)
	for done("agent") == "" || done("server") == "" {
		if time.Now().After(deadline) {
			t.Fatalf("6 minutes on, the states seen: %v; want an agent and a server intermediate through %v\nauthority:\n%s", seen, want, e.auth.Logs())
		}
		var s struct {
			Certificates []cert `json:"certificates"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, "ca", "status", "--data", e.dir, "-o", "json")), &s); err != nil {
			t.Fatal(err)
		}
		for _, c := range s.Certificates {
			if c.Kind != "intermediate" {
				continue
			}
			k := c.Role + "/" + c.Serial
			if first {
				initial[k] = true // made by muster init: never seen prepared
			}
			if st := seen[k]; len(st) == 0 || st[len(st)-1] != c.State {
				seen[k] = append(st, c.State)
			}
			custodyOf[k] = c.KeyCustody
		}
		first = false
		time.Sleep(time.Second)
	}

	var retires []struct {
		Target string `json:"target"`
		Reason string `json:"reason"`
	}
	// The retirement is written with its ca.retire record; how the key's
	// destruction went is the ca.destroy_key record after it.
	if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", e.dir, "--action", "ca.destroy_key", "-o", "json")), &retires); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"agent", "server"} {
		k := done(role)
		if custodyOf[k] != "destroyed" {
			t.Errorf("retired %s: key custody %q; want destroyed", k, custodyOf[k])
		}
		if !slices.ContainsFunc(retires, func(r struct {
			Target string `json:"target"`
			Reason string `json:"reason"`
		}) bool {
			return r.Target == k && strings.Contains(r.Reason, "its key (sealed) destroyed")
		}) {
			t.Errorf("no ca.destroy_key record of %s saying its key was destroyed: %+v", k, retires)
		}
	}

	metrics := metricsOf(t, e.auth.metrics)
	checkNoRefusedRenewal(t, metrics, "during the rotations", true)
	if strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("the agent logged errors:\n%s", logs.String())
	}

	// The agent's certificate chains through the newest agent
	// intermediate to the root, not through the init-time one.
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
	fileInter, _ := os.ReadFile(filepath.Join(e.dir, "ca", "agent.crt"))
	if strings.Contains(string(pem), strings.TrimSpace(string(fileInter))) {
		t.Fatal("the agent's chain still carries the init-time agent intermediate after two rotations")
	}
}
