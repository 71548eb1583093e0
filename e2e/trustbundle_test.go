package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type caStatusOut struct {
	RootKey         string `json:"root_key"`
	BundleDigest    string `json:"bundle_digest"`
	ConnectedAgents int64  `json:"connected_agents"`
	Certificates    []struct {
		Kind          string `json:"kind"`
		Role          string `json:"role"`
		State         string `json:"state"`
		Serial        string `json:"serial"`
		AgentsHolding int64  `json:"agents_holding"`
	} `json:"certificates"`
	Warnings []string `json:"warnings"`
}

func caStatus(t *testing.T, dir string) caStatusOut {
	t.Helper()
	var s caStatusOut
	out := mustRun(t, "ca", "status", "--data", dir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("ca status -o json printed %q: %v", out, err)
	}
	return s
}

// TestTrustBundleAcrossRotations: with --ca-intermediate-ttl 2m (the
// floor) and 20-second agent certificates, three agents renew across two
// automatic rotations of the agent and server intermediates with no
// refused renewal; each holds the authority's current trust bundle (its
// digest in state.json, the certificates in certs/bundle.pem), and
// openssl verifies each leaf with -CAfile certs/ca.crt -untrusted
// certs/bundle.pem. A fourth agent (bound keypair) stopped before the
// first rotation and started after the second comes back by itself and
// takes the new bundle. muster ca status lists the certificates and counts
// the agents holding the active ones. It waits for two rotations: about
// 2.5 minutes, mostly idle.
func TestTrustBundleAcrossRotations(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--ca-intermediate-ttl", "2m", "--agent-cert-ttl", "20s")

	// The sleeper joins and refreshes once, then stops.
	sleeper := filepath.Join(t.TempDir(), "sleeper")
	_, keyFile := keypairFile(t, sleeper)
	mustRun(t, "bot", "add", "sleeper", "--public-key", keyFile, "--recovery-limit", "3", "--data", e.dir)
	mustRun(t, "agent", "join", "--data", sleeper, "--bound-keypair", "sleeper", "--node", "sleeper",
		"--authority", e.auth.addr, "--ca-fingerprint", e.fingerprint)
	runSleeper := func() *proc {
		p, _ := startProc(t, "sleeper", "agent started", "agent", "run", "--data", sleeper, "--log-format", "json")
		return p
	}
	p := runSleeper()
	waitLog(t, p, "refresh done", 1, 30*time.Second)
	p.stop(t)
	heldBefore := agentState(t, sleeper).TrustBundle
	if heldBefore == "" || heldBefore != caStatus(t, e.dir).BundleDigest {
		t.Fatalf("the sleeper holds bundle %q, the authority serves %q", heldBefore, caStatus(t, e.dir).BundleDigest)
	}

	var agents []*proc
	var dirs []string
	for i := range 3 {
		tok := e.createToken(t)
		adir := filepath.Join(t.TempDir(), fmt.Sprintf("agent-%d", i))
		p, _ := startProcEnv(t, fmt.Sprintf("agent-%d", i), "agent started",
			[]string{"MUSTER_JOIN_URI=" + tok.URI, fmt.Sprintf("MUSTER_NODE_ID=renewer-%d", i)},
			"agent", "run", "--data", adir, "--log-format", "json")
		agents = append(agents, p)
		dirs = append(dirs, adir)
	}

	type rec struct {
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
	// Running agents follow each change of the bundle within seconds.
	holdsCurrent := func(adir string) bool {
		want := caStatus(t, e.dir).BundleDigest
		st, err := os.ReadFile(filepath.Join(adir, "state.json"))
		return err == nil && strings.Contains(string(st), want)
	}
	checked := map[string]bool{}
	deadline := time.Now().Add(4 * time.Minute)
	for n := activations(); n["agent"] < 2 || n["server"] < 2; n = activations() {
		if time.Now().After(deadline) {
			t.Fatalf("activations after 4 minutes: %v, want two of the agent and server intermediates", n)
		}
		if d := caStatus(t, e.dir).BundleDigest; !checked[d] {
			checked[d] = true
			for i, adir := range dirs {
				waitFor(t, agentReach, fmt.Sprintf("agent-%d holds bundle %s", i, d), func() bool {
					return holdsCurrent(adir) || caStatus(t, e.dir).BundleDigest != d
				})
			}
		}
		time.Sleep(time.Second)
	}
	if len(checked) < 3 {
		t.Errorf("saw %d bundles during two rotations, want at least 3 (each prepare changes it)", len(checked))
	}

	// The sleeper missed two rotations: started, it recovers and takes the
	// bundle of now.
	p = runSleeper()
	waitLog(t, p, "recovery done", 1, 30*time.Second)
	waitFor(t, agentReach, "the sleeper holds the current bundle", func() bool { return holdsCurrent(sleeper) })

	// A renewal or so more for every agent under the newest intermediates.
	time.Sleep(12 * time.Second)
	metrics := metricsOf(t, e.auth.metrics)
	checkNoRefusedRenewal(t, metrics, "during the rotations", true)
	for _, a := range append(agents, p) {
		if logs := a.Logs(); strings.Contains(logs, `"level":"ERROR"`) || strings.Contains(logs, "failed; retrying") ||
			strings.Contains(logs, "not taken") {
			t.Errorf("%s logged a failure:\n%s", a.name, logs)
		}
	}

	for _, adir := range append(dirs, sleeper) {
		leaf := filepath.Join(adir, "certs", "agent.crt")
		out, err := exec.Command("openssl", "verify", "-CAfile", filepath.Join(adir, "certs", "ca.crt"),
			"-untrusted", filepath.Join(adir, "certs", "bundle.pem"), "-purpose", "sslclient", leaf).CombinedOutput()
		if err != nil || !strings.Contains(string(out), ": OK") {
			t.Errorf("openssl verify %s: %v\n%s", leaf, err, out)
		}
	}

	// ca status: the root online, the active agent and server
	// intermediates held by the four connected agents.
	var s caStatusOut
	waitFor(t, agentReach, "ca status counts the four agents holding the active intermediates", func() bool {
		s = caStatus(t, e.dir)
		if s.RootKey != "online" || s.ConnectedAgents != 4 {
			return false
		}
		active := 0
		for _, c := range s.Certificates {
			if c.Kind == "root" && c.AgentsHolding != 4 {
				return false
			}
			if c.Kind == "intermediate" && c.State == "active" {
				active++
				if c.AgentsHolding != 4 {
					return false
				}
			}
			if c.State == "retired" && c.AgentsHolding != 0 {
				return false
			}
		}
		return active == 4
	})
	if len(s.Warnings) != 0 {
		t.Errorf("ca status warns with the root key online: %q", s.Warnings)
	}
	if text := mustRun(t, "ca", "status", "--data", e.dir); !strings.Contains(text, "Root key: online") || !strings.Contains(text, "retiring") {
		t.Errorf("ca status:\n%s", text)
	}
	for _, a := range agents {
		a.stop(t)
	}
	p.stop(t)
}
