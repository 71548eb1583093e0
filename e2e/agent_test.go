package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// agentEnv is a running authority and what an agent needs to reach it.
type agentEnv struct {
	dir         string
	auth        *authorityProc
	authorityID string
	fingerprint string
}

func newAgentEnv(t *testing.T, authorityArgs ...string) *agentEnv {
	t.Helper()
	dir, out := initDir(t)
	e := &agentEnv{dir: dir, auth: startAuthority(t, dir, authorityArgs...)}
	e.authorityID, _ = out["authority_id"].(string)
	e.fingerprint, _ = out["ca_fingerprint"].(string)
	return e
}

type createdToken struct {
	Token     string `json:"token"`
	ID        string `json:"id"`
	URI       string `json:"uri"`
	ExpiresAt string `json:"expires_at"`
}

func (e *agentEnv) createToken(t *testing.T, args ...string) createdToken {
	t.Helper()
	var tok createdToken
	out := mustRun(t, append([]string{"token", "create", "--data", e.dir, "-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.Token == "" || tok.URI == "" || tok.ID == "" {
		t.Fatalf("token create -o json printed %q: %v", out, err)
	}
	return tok
}

// agentStatus runs agent status -o json.
func agentStatus(t *testing.T, adir string) map[string]any {
	t.Helper()
	var st map[string]any
	out := mustRun(t, "agent", "status", "--data", adir, "-o", "json")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("agent status -o json printed %q: %v", out, err)
	}
	return st
}

// assertNoAgentCerts checks that a failed join left no certificate files
// and no state.
func assertNoAgentCerts(t *testing.T, adir string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(adir, "certs"))
	for _, e := range entries {
		t.Errorf("certs/%s exists after a failed join", e.Name())
	}
	if _, err := os.Stat(filepath.Join(adir, "state.json")); !os.IsNotExist(err) {
		t.Errorf("state.json exists after a failed join: %v", err)
	}
}

func TestAgentJoinRenewStatus(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	tok := e.createToken(t, "--uses", "1")
	adir := filepath.Join(t.TempDir(), "agent")

	r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", adir, "--node", "n1",
		"--authority", e.auth.addr, "-o", "json")
	if r.code != 0 {
		t.Fatalf("agent join: exit %d\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, "warning") {
		t.Errorf("a token from the environment drew a warning: %s", r.stderr)
	}
	var joined map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &joined); err != nil || joined["node_id"] != "n1" || joined["instance_id"] == "" {
		t.Fatalf("agent join -o json printed %q: %v", r.stdout, err)
	}

	// DESIGN.md's layout and modes.
	modes := map[string]os.FileMode{
		".": 0o700, "certs": 0o700, "keys": 0o700,
		"certs/agent.key": 0o600, "certs/agent.p12": 0o600, "certs/agent.p12.pass": 0o600,
		"certs/agent.crt": 0, "certs/ca.crt": 0, "agent.yaml": 0, "state.json": 0,
	}
	for name, mode := range modes {
		fi, err := os.Stat(filepath.Join(adir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if mode != 0 && fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode().Perm(), mode)
		}
	}
	cfg, _ := os.ReadFile(filepath.Join(adir, "agent.yaml"))
	if strings.Contains(string(cfg), tok.Token[7:]) || !strings.Contains(string(cfg), "n1") {
		t.Errorf("agent.yaml after the join:\n%s", cfg)
	}

	st := agentStatus(t, adir)
	notAfter, _ := time.Parse(time.RFC3339, st["not_after"].(string))
	if st["node_id"] != "n1" || st["authority_id"] != e.authorityID || st["authority"] != e.auth.addr ||
		st["generation"] != 0.0 || st["join_method"] != "token" || st["last_renewal"] != nil ||
		st["spiffe_id"] != "spiffe://"+e.authorityID+"/agent/n1" || time.Until(notAfter) < time.Hour {
		t.Fatalf("agent status after the join: %v", st)
	}
	text := mustRun(t, "agent", "status", "--data", adir)
	for _, want := range []string{"n1", e.authorityID, "Generation:    0", "never"} {
		if !strings.Contains(text, want) {
			t.Errorf("agent status lacks %q:\n%s", want, text)
		}
	}

	// Each renewal is the next generation.
	mustRun(t, "agent", "renew", "--data", adir)
	st = agentStatus(t, adir)
	if st["generation"] != 1.0 || st["last_renewal"] == nil || st["instance_id"] != joined["instance_id"] {
		t.Fatalf("agent status after a renewal: %v", st)
	}
	r = muster(t, []string{"MUSTER_AGENT_DATA=" + adir}, "agent", "renew", "-o", "json")
	if r.code != 0 || !strings.Contains(r.stdout, `"generation": 2`) {
		t.Fatalf("second renewal: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var show struct {
		Agent map[string]any `json:"agent"`
	}
	json.Unmarshal([]byte(mustRun(t, "agents", "show", "n1", "--data", e.dir, "-o", "json")), &show)
	if show.Agent["generation"] != 2.0 {
		t.Errorf("the authority records generation %v, want 2", show.Agent["generation"])
	}

	// A second join over the identity needs --force.
	line := mustFail(t, "agent", "join", "--data", adir, "--node", "n1", e.createToken(t).URI)
	if !strings.Contains(line, "--force") {
		t.Errorf("join over an identity: %q", line)
	}

	// A deleted node cannot renew, and the agent says why.
	mustRun(t, "agents", "delete", "n1", "--data", e.dir)
	line = mustFail(t, "agent", "renew", "--data", adir)
	if !strings.Contains(line, "renewal failed: PERMISSION_DENIED") || !strings.Contains(line, "deleted") {
		t.Errorf("renewal of a deleted node: %q", line)
	}
	if _, err := os.Stat(filepath.Join(adir, "certs", "agent.crt")); err != nil {
		t.Errorf("a refused renewal removed the identity: %v", err)
	}
}

func TestAgentJoinWithURI(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)

	// As the last argument, as token create suggests: it works, with a
	// warning that the command line is visible.
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	r := muster(t, nil, "agent", "join", "--data", adir, "--node", "n1", tok.URI)
	if r.code != 0 {
		t.Fatalf("agent join URI: exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "visible to other users") {
		t.Errorf("no warning for a URI on the command line: %q", r.stderr)
	}
	if st := agentStatus(t, adir); st["node_id"] != "n1" || st["authority"] != e.auth.addr {
		t.Errorf("status %v", st)
	}
	cfg, _ := os.ReadFile(filepath.Join(adir, "agent.yaml"))
	if !strings.Contains(string(cfg), e.fingerprint) {
		t.Errorf("agent.yaml does not record the fingerprint %s:\n%s", e.fingerprint, cfg)
	}

	// From the environment alone, the node from the URI of a bound token.
	bound := e.createToken(t, "--node", "n2")
	adir2 := filepath.Join(t.TempDir(), "agent")
	r = muster(t, []string{"MUSTER_AGENT_DATA=" + adir2, "MUSTER_JOIN_URI=" + bound.URI}, "agent", "join")
	if r.code != 0 {
		t.Fatalf("agent join with MUSTER_JOIN_URI: exit %d\n%s", r.code, r.stderr)
	}
	if r.stderr != "" {
		t.Errorf("warnings for a URI from the environment: %q", r.stderr)
	}
	if st := agentStatus(t, adir2); st["node_id"] != "n2" {
		t.Errorf("status %v", st)
	}
}

func TestAgentJoinRefusals(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	tok := e.createToken(t, "--uses", "1")

	// A wrong secret: the trust bundle does not verify, nothing is sent.
	wrong := tok.ID + ".0123456789abcdef"
	if wrong == tok.Token {
		wrong = tok.ID + ".fedcba9876543210"
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokFile, []byte(wrong+"\n"), 0o600)
	adir := filepath.Join(t.TempDir(), "agent")
	line := mustFail(t, "agent", "join", "--data", adir, "--node", "n1", "--authority", e.auth.addr, "--token-file", tokFile)
	if !strings.Contains(line, "join failed: NOT_FOUND") || strings.Contains(line, wrong[7:]) {
		t.Errorf("join with a wrong secret: %q", line)
	}
	assertNoAgentCerts(t, adir)

	// A pinned fingerprint that is not the authority's.
	line = mustFail(t, "agent", "join", "--data", adir, "--node", "n1", "--authority", e.auth.addr,
		"--token-file", tokFile, "--ca-fingerprint", "sha256:"+strings.Repeat("0", 64))
	if !strings.Contains(line, "join failed") {
		t.Errorf("join with a wrong fingerprint: %q", line)
	}
	fp := filepath.Join(t.TempDir(), "token")
	os.WriteFile(fp, []byte(tok.Token), 0o600)
	line = mustFail(t, "agent", "join", "--data", adir, "--node", "n1", "--authority", e.auth.addr,
		"--token-file", fp, "--ca-fingerprint", "sha256:"+strings.Repeat("0", 64))
	if !strings.Contains(line, "fingerprint") {
		t.Errorf("join with a wrong fingerprint: %q", line)
	}
	assertNoAgentCerts(t, adir)

	// The single use goes to the first node; the second is refused.
	r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token, "MUSTER_AUTHORITY=" + e.auth.addr}, "agent", "join", "--data", adir, "--node", "n1")
	if r.code != 0 {
		t.Fatalf("join: exit %d\n%s", r.code, r.stderr)
	}
	adir2 := filepath.Join(t.TempDir(), "agent")
	r = muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token, "MUSTER_AUTHORITY=" + e.auth.addr}, "agent", "join", "--data", adir2, "--node", "n2")
	if r.code == 0 || !strings.Contains(r.stderr, "muster: join failed: FAILED_PRECONDITION") {
		t.Errorf("second join with a used token: exit %d, %q", r.code, r.stderr)
	}
	assertNoAgentCerts(t, adir2)

	// --token works, with a warning.
	r = muster(t, nil, "agent", "join", "--data", filepath.Join(t.TempDir(), "a"), "--node", "n3",
		"--authority", e.auth.addr, "--token", e.createToken(t).Token)
	if r.code != 0 || !strings.Contains(r.stderr, "--token is visible to other users") {
		t.Errorf("join with --token: exit %d, %q", r.code, r.stderr)
	}
}

// TestAgentRun: run joins an empty directory from the environment, serves
// its metrics and health probes, and stops cleanly on SIGTERM.
func TestAgentRun(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := execCommand(ctx, "agent", "run", "--data", adir, "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = append(cmd.Env, "MUSTER_JOIN_URI="+tok.URI, "MUSTER_NODE_ID=runner")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		logs strings.Builder
	)
	records := make(chan map[string]any, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil {
				select {
				case records <- rec:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
		close(records)
	}()
	var metricsAddr string
	loaded := false
	for !loaded {
		select {
		case rec, ok := <-records:
			if !ok {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("agent run ended early:\n%s", logs.String())
			}
			switch rec["msg"] {
			case "agent started":
				metricsAddr, _ = rec["metrics_listen"].(string)
			case "identity loaded":
				loaded = true
			}
		case <-time.After(30 * time.Second):
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("agent run did not load an identity in 30s:\n%s", logs.String())
		}
	}
	if st := agentStatus(t, adir); st["node_id"] != "runner" {
		t.Errorf("status %v", st)
	}
	body := metricsOf(t, metricsAddr)
	for _, want := range []string{"muster_agent_identity_expiry_timestamp_seconds", "muster_agent_generation 0", "muster_agent_renewals_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	// The probes an orchestrator or the image's health check uses, through
	// muster healthcheck as an image without curl would.
	for _, path := range []string{"/healthz", "/readyz"} {
		mustRun(t, "healthcheck", "--url", "http://"+metricsAddr+path)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	// Read the log to its end before waiting, as os/exec asks.
	stopped := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-records:
		case <-stopped:
			cmd.Process.Kill()
			t.Fatal("agent run did not stop within 10s of SIGTERM")
		}
	}
	if err := cmd.Wait(); err != nil {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("agent run after SIGTERM: %v\n%s", err, logs.String())
	}
}

// TestAgentRunRenewsOnItsOwn: with 8-second certificates the agent renews
// at about half-life, again and again, without anyone asking.
func TestAgentRunRenewsOnItsOwn(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--agent-cert-ttl", "8s")
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := execCommand(ctx, "agent", "run", "--data", adir, "--log-format", "json")
	cmd.Env = append(cmd.Env, "MUSTER_JOIN_URI="+tok.URI, "MUSTER_NODE_ID=renewer")
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := muster(t, nil, "agent", "status", "--data", adir, "-o", "json")
		var st map[string]any
		if r.code == 0 && json.Unmarshal([]byte(r.stdout), &st) == nil && st["generation"].(float64) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second renewal within 30s of 8-second certificates; last status %s\nagent log:\n%s", r.stdout, logs.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	var show struct {
		Certificates []map[string]any `json:"certificates"`
	}
	json.Unmarshal([]byte(mustRun(t, "agents", "show", "renewer", "--data", e.dir, "-o", "json")), &show)
	if len(show.Certificates) < 3 {
		t.Fatalf("authority recorded %d certificates, want at least 3", len(show.Certificates))
	}
}

// syncWriter lets a test read a process's output while it is written.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.(fmt.Stringer).String()
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestAgentJoinsThroughTheBootstrapListener: an agent that joins through
// the bootstrap-only listener renews at the API address the authority
// advertises in its signed trust bundle, as that listener serves no
// renewals.
func TestAgentJoinsThroughTheBootstrapListener(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, "--bootstrap-listen", "127.0.0.1:0")
	if e.auth.bootstrap == "" || e.auth.bootstrap == e.auth.addr {
		t.Fatalf("no separate bootstrap listener: %q", e.auth.bootstrap)
	}
	tok := e.createToken(t)
	adir := filepath.Join(t.TempDir(), "agent")
	r := muster(t, []string{"MUSTER_JOIN_TOKEN=" + tok.Token}, "agent", "join", "--data", adir, "--node", "edge-1",
		"--authority", e.auth.bootstrap)
	if r.code != 0 {
		t.Fatalf("join through the bootstrap listener: exit %d\n%s", r.code, r.stderr)
	}
	mustRun(t, "agent", "renew", "--data", adir)
	if st := agentStatus(t, adir); st["generation"] != 1.0 {
		t.Fatalf("status after renewal: %v", st)
	}
	// The bootstrap listener serves the bootstrap RPCs alone.
	if r := muster(t, nil, "status", "--data", e.dir, "--authority", e.auth.bootstrap); r.code == 0 || !strings.Contains(r.stderr, "UNIMPLEMENTED: the server at that address is not a muster authority's API address") {
		t.Fatalf("admin call on the bootstrap listener: exit %d, %s", r.code, r.stderr)
	}
}
