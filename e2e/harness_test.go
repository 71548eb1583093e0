// Package e2e runs the real muster binary: it is built once in TestMain,
// and every test drives it the way an operator would, on loopback ports
// the OS chooses.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var musterBin string

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "muster-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	musterBin = filepath.Join(tmp, "muster")
	build := exec.Command("go", "build", "-o", musterBin, "../cmd/muster")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building muster:", err)
		os.Exit(1)
	}
	code := m.Run()
	if pg != nil {
		pg.Stop()
	}
	os.RemoveAll(tmp)
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

// muster runs the binary to completion with a clean environment plus env.
func muster(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, musterBin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running muster %v: %v", args, err)
	}
	return result{out.String(), errb.String(), code}
}

// mustRun runs muster and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := muster(t, nil, args...)
	if r.code != 0 {
		t.Fatalf("muster %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// mustFail runs muster, expects a non-zero exit and one line on stderr, and
// returns that line.
func mustFail(t *testing.T, args ...string) string {
	t.Helper()
	r := muster(t, nil, args...)
	if r.code == 0 {
		t.Fatalf("muster %s succeeded, want a failure\nstdout: %s", strings.Join(args, " "), r.stdout)
	}
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "muster: ") {
		t.Fatalf("muster %s: last stderr line %q does not start with \"muster: \"\nstderr: %s", strings.Join(args, " "), last, r.stderr)
	}
	return last
}

// initDir runs muster init in a fresh directory and returns the directory
// and the JSON it printed.
func initDir(t *testing.T, extra ...string) (string, map[string]any) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "authority")
	out := mustRun(t, append([]string{"init", "--data", dir, "-o", "json"}, extra...)...)
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("init -o json printed %q: %v", out, err)
	}
	return dir, got
}

// authorityProc is a running `muster authority`.
type authorityProc struct {
	cmd *exec.Cmd
	// addr is the advertised address, listen the bound one.
	addr, listen string
	metrics      string
	// bootstrap is the bootstrap-only listener, when one was asked for.
	bootstrap string
	mu        sync.Mutex
	logs      bytes.Buffer
	done      chan struct{}
	exitErr   error
}

func (p *authorityProc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// startAuthority starts the authority on OS-chosen loopback ports and waits
// for its "authority started" log line.
func startAuthority(t *testing.T, dir string, extra ...string) *authorityProc {
	t.Helper()
	args := append([]string{"authority", "--data", dir, "--listen", "127.0.0.1:0",
		"--metrics-listen", "127.0.0.1:0", "--log-format", "json"}, extra...)
	cmd := exec.Command(musterBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &authorityProc{cmd: cmd, done: make(chan struct{})}
	started := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs.WriteString(line + "\n")
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "authority started" {
				started <- rec
			}
		}
		io.Copy(io.Discard, stderr)
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	select {
	case rec := <-started:
		p.addr, _ = rec["advertise"].(string)
		p.listen, _ = rec["listen"].(string)
		p.metrics, _ = rec["metrics_listen"].(string)
		p.bootstrap, _ = rec["bootstrap_listen"].(string)
	case <-p.done:
		t.Fatalf("authority exited before starting: %v\n%s", p.exitErr, p.Logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("authority did not start in 30s\n%s", p.Logs())
	}
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *authorityProc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.exitErr != nil {
			t.Errorf("authority exited with %v after SIGTERM\n%s", p.exitErr, p.Logs())
		}
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		t.Errorf("authority did not stop within 20s of SIGTERM\n%s", p.Logs())
	}
}

// execCommand prepares the binary with a clean environment.
func execCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, musterBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	return cmd
}
