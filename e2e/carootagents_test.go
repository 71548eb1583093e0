package e2e

import (
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/ca"
)

// TestRootRotationUnderRunningAgents: two agents with one-minute
// certificates follow a root rotation through all four phases with no
// refused renewal and no new join. In init both take the new root from
// their stream (through the cross-certificate). One agent is stopped for
// update_agents and started again once update_servers began; from
// update_servers on each renews to a leaf that chains to the new root
// (openssl, against the new root alone), and both keep renewing in
// standby, when the old root is no longer trusted.
func TestRootRotationUnderRunningAgents(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "1m")
	ra := startRotationAgents(t, e, "rooted")
	serial, chainsTo := ra.serial, ra.chainsTo
	roots := func(i int) int { return len(ra.rootsOf(i)) }

	// init: both roots in the bundle; running agents take the new one.
	st := caRoot(t, e.dir, "rotate")
	if st.Phase != "init" || st.NewRoot == nil {
		t.Fatalf("after rotate: %+v", st)
	}
	newRoot := pemFile(t, "new-root.pem", st.NewRoot.PEM)
	if b, _ := pem.Decode([]byte(st.NewRoot.PEM)); b == nil {
		t.Fatalf("the new root is not PEM: %q", st.NewRoot.PEM)
	}
	for i := range ra.dirs {
		for end := time.Now().Add(15 * time.Second); roots(i) != 2; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("agent-%d trusts %d roots 15 s after the rotation began, want 2:\n%s\nauthority:\n%s", i, roots(i), ra.procs[i].Logs(), e.auth.Logs())
			}
		}
	}

	// update_agents with agent-1 stopped.
	ra.procs[1].stop(t)
	if st = caRoot(t, e.dir, "next-phase"); st.Phase != "update_agents" {
		t.Fatalf("next-phase from init: %+v", st)
	}
	time.Sleep(3 * time.Second)

	// update_servers: the leader moves the intermediates under the new
	// root; agent-1 comes back and both renew to leaves under it.
	if st = caRoot(t, e.dir, "next-phase"); st.Phase != "update_servers" {
		t.Fatalf("next-phase from update_agents: %+v", st)
	}
	ra.start(1, nil)
	for i := range ra.dirs {
		before := serial(i)
		waitFor(t, 75*time.Second, fmt.Sprintf("agent-%d renewed to a leaf under the new root", i), func() bool {
			return serial(i) != before && chainsTo(i, newRoot)
		})
	}

	// standby: the old root is no longer trusted; both keep renewing.
	// The operator's identity moves under the new root first (standby
	// refuses to strand it).
	mustRun(t, "admin", "renew", "--data", e.dir)
	if st = caRoot(t, e.dir, "next-phase"); st.Phase != "standby" || len(st.TrustedRoots) != 1 {
		t.Fatalf("next-phase from update_servers: %+v", st)
	}
	for i := range ra.dirs {
		before := serial(i)
		waitFor(t, 75*time.Second, fmt.Sprintf("agent-%d renewed in standby", i), func() bool {
			return serial(i) != before && chainsTo(i, newRoot)
		})
	}

	ra.stopCheckingNoFailure(t, "during the root rotation")
}

// rotationAgents are the two agents a root rotation test runs, joined by
// tokens of e as nodes PREFIX-0 and PREFIX-1 (certificates in
// dirs[i]/certs), through its phases.
type rotationAgents struct {
	e     *agentEnv
	t     *testing.T
	dirs  [2]string
	procs [2]*proc
}

func startRotationAgents(t *testing.T, e *agentEnv, prefix string) *rotationAgents {
	t.Helper()
	ra := &rotationAgents{e: e, t: t}
	for i := range ra.dirs {
		ra.dirs[i] = filepath.Join(t.TempDir(), fmt.Sprintf("agent-%d", i))
		ra.start(i, []string{"MUSTER_JOIN_URI=" + e.createToken(t).URI, fmt.Sprintf("MUSTER_NODE_ID=%s-%d", prefix, i)})
	}
	for i := range ra.dirs {
		waitFor(t, 30*time.Second, fmt.Sprintf("agent-%d joined", i), func() bool {
			_, err := agent.Dir(ra.dirs[i]).ReadState()
			return err == nil && agent.Dir(ra.dirs[i]).HasIdentity()
		})
	}
	return ra
}

// start runs agent i (again), with env added to its environment.
func (ra *rotationAgents) start(i int, env []string) {
	ra.t.Helper()
	ra.procs[i], _ = startProcEnv(ra.t, fmt.Sprintf("agent-%d", i), "agent started", env,
		"agent", "run", "--data", ra.dirs[i], "--log-format", "json")
}

// serial is agent i's certificate serial (state.json).
func (ra *rotationAgents) serial(i int) string { return agentState(ra.t, ra.dirs[i]).Serial }

// rootsOf are the fingerprints of the roots in agent i's ca.crt, sorted.
func (ra *rotationAgents) rootsOf(i int) []string {
	b, _ := os.ReadFile(filepath.Join(ra.dirs[i], "certs", "ca.crt"))
	certs, _ := ca.ParseCertsPEM(b)
	var fps []string
	for _, c := range certs {
		fps = append(fps, ca.Fingerprint(c))
	}
	slices.Sort(fps)
	return fps
}

// verify runs openssl verify on agent i's certificate against the roots
// in caFile (PEM), with its bundle.pem as the untrusted pool.
func (ra *rotationAgents) verify(i int, caFile string) (string, bool) {
	certs := filepath.Join(ra.dirs[i], "certs")
	out, err := exec.Command("openssl", "verify", "-CAfile", caFile, "-untrusted", filepath.Join(certs, "bundle.pem"),
		"-purpose", "sslclient", filepath.Join(certs, "agent.crt")).CombinedOutput()
	return string(out), err == nil && strings.Contains(string(out), ": OK")
}

// chainsTo reports whether agent i's certificate verifies against root
// (a PEM file) alone.
func (ra *rotationAgents) chainsTo(i int, root string) bool {
	_, ok := ra.verify(i, root)
	return ok
}

// stopCheckingNoFailure checks the authority refused no renewal and no
// agent logged an error or was told to join again (when names the test's
// span), and stops the agents.
func (ra *rotationAgents) stopCheckingNoFailure(t *testing.T, when string) {
	t.Helper()
	checkNoRefusedRenewal(t, metricsOf(t, ra.e.auth.metrics), when, false)
	for _, p := range ra.procs {
		if logs := p.Logs(); strings.Contains(logs, `"level":"ERROR"`) || strings.Contains(logs, "must join again") {
			t.Errorf("%s logged a failure:\n%s", p.name, logs)
		}
		p.stop(t)
	}
}

// pemFile writes text (PEM) to a file name in a temporary directory.
func pemFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
