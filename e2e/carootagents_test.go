package e2e

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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
	var dirs [2]string
	var procs [2]*proc
	start := func(i int, env []string) {
		p, _ := startProcEnv(t, fmt.Sprintf("agent-%d", i), "agent started", env,
			"agent", "run", "--data", dirs[i], "--log-format", "json")
		procs[i] = p
	}
	for i := range dirs {
		tok := e.createToken(t)
		dirs[i] = filepath.Join(t.TempDir(), fmt.Sprintf("agent-%d", i))
		start(i, []string{"MUSTER_JOIN_URI=" + tok.URI, fmt.Sprintf("MUSTER_NODE_ID=rooted-%d", i)})
	}
	roots := func(i int) int {
		b, _ := os.ReadFile(filepath.Join(dirs[i], "certs", "ca.crt"))
		return bytes.Count(b, []byte("BEGIN CERTIFICATE"))
	}
	serial := func(i int) string { return agentState(t, dirs[i]).Serial }
	// chainsTo reports whether agent i's certificate verifies against
	// root (a PEM file) alone, with its bundle as the untrusted pool.
	chainsTo := func(i int, root string) bool {
		out, err := exec.Command("openssl", "verify", "-CAfile", root,
			"-untrusted", filepath.Join(dirs[i], "certs", "bundle.pem"), "-purpose", "sslclient",
			filepath.Join(dirs[i], "certs", "agent.crt")).CombinedOutput()
		return err == nil && strings.Contains(string(out), ": OK")
	}

	// init: both roots in the bundle; running agents take the new one.
	st := caRoot(t, e.dir, "rotate")
	if st.Phase != "init" || st.NewRoot == nil {
		t.Fatalf("after rotate: %+v", st)
	}
	newRoot := filepath.Join(t.TempDir(), "new-root.pem")
	if err := os.WriteFile(newRoot, []byte(st.NewRoot.PEM), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := pem.Decode([]byte(st.NewRoot.PEM)); b == nil {
		t.Fatalf("the new root is not PEM: %q", st.NewRoot.PEM)
	}
	for i := range dirs {
		for end := time.Now().Add(15 * time.Second); roots(i) != 2; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("agent-%d trusts %d roots 15 s after the rotation began, want 2:\n%s\nauthority:\n%s", i, roots(i), procs[i].Logs(), e.auth.Logs())
			}
		}
	}

	// update_agents with agent-1 stopped.
	procs[1].stop(t)
	if st = caRoot(t, e.dir, "next-phase"); st.Phase != "update_agents" {
		t.Fatalf("next-phase from init: %+v", st)
	}
	time.Sleep(3 * time.Second)

	// update_servers: the leader moves the intermediates under the new
	// root; agent-1 comes back and both renew to leaves under it.
	if st = caRoot(t, e.dir, "next-phase"); st.Phase != "update_servers" {
		t.Fatalf("next-phase from update_agents: %+v", st)
	}
	start(1, nil)
	for i := range dirs {
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
	for i := range dirs {
		before := serial(i)
		waitFor(t, 75*time.Second, fmt.Sprintf("agent-%d renewed in standby", i), func() bool {
			return serial(i) != before && chainsTo(i, newRoot)
		})
	}

	metrics := metricsOf(t, e.auth.metrics)
	for _, m := range regexp.MustCompile(`(?m)^muster_renewals_total\{result="([a-z_]+)"\} (\d+)`).FindAllStringSubmatch(metrics, -1) {
		if m[1] != "ok" && m[2] != "0" {
			t.Errorf("renewals refused during the root rotation: %s", m[0])
		}
	}
	for _, p := range procs {
		if logs := p.Logs(); strings.Contains(logs, `"level":"ERROR"`) || strings.Contains(logs, "must join again") {
			t.Errorf("%s logged a failure:\n%s", p.name, logs)
		}
		p.stop(t)
	}
}
