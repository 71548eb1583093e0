// Package e2e runs the real muster binary: it is built once in TestMain,
// and every test drives it the way an operator would, on loopback ports
// the OS chooses.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var musterBin string

// e2eParallel is how many tests that call t.Parallel run at once by
// default (TestMain). They wait more than they compute (the whole package
// used about 130 s of CPU in 400-700 s), but not more: on a two-core
// machine shared with other builds (load 15-40), 32 at once made the
// tests whose agents hold 6-second certificates miss their renewals and
// a 4-second PSK grace pass before its joins. With 8 the package took
// 407 s there, against 710 s one test at a time; Go starts the waiting
// tests in no set order, so the longest (three minutes of CA rotations)
// may start after others.
const e2eParallel = 8

// buildTags are the tags the binary is built with: those of this test
// binary's variant (pkcs11_test.go adds -tags pkcs11).
var buildTags []string

func TestMain(m *testing.M) {
	// These tests drive the real binary through rotations, outages and
	// restarts; under -race on two cores, one after the other, they took
	// longer than go test's default 10 minutes. A -timeout other than the
	// default still wins.
	flag.Parse()
	if f := flag.Lookup("test.timeout"); f != nil && f.Value.String() == (10*time.Minute).String() {
		if err := f.Value.Set((40 * time.Minute).String()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	// Most tests wait on timers (rotations, outages, certificate
	// lifetimes), not on the CPU: they call t.Parallel, and up to
	// e2eParallel of them run at once, not go test's default of one per
	// core (two in CI, where the waits added up to over ten minutes). A
	// -parallel other than the default still wins.
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == strconv.Itoa(runtime.GOMAXPROCS(0)) {
		if err := f.Value.Set(strconv.Itoa(max(e2eParallel, runtime.GOMAXPROCS(0)))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	tmp, err := os.MkdirTemp("", "muster-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	musterBin = filepath.Join(tmp, "muster")
	build := exec.Command("go", append(append([]string{"build"}, buildTags...), "-o", musterBin, "../cmd/muster")...)
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
	return musterIn(t, "", env, args...)
}

// musterIn is muster run in the working directory wd ("" for the test's).
func musterIn(t *testing.T, wd string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, musterBin, args...)
	cmd.Dir = wd
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

// proc is a running muster server: `muster authority` or `muster
// discovery`, its JSON log collected.
type proc struct {
	name string
	cmd  *exec.Cmd
	// addr is the address clients use (the authority's advertised one,
	// discovery's bound one), listen the bound one, metrics the metrics
	// listener's.
	addr, listen, metrics string
	// bootstrap is the authority's bootstrap-only listener, when one was
	// asked for.
	bootstrap string
	// fingerprint and issuer are discovery's CA pin and ticket issuer.
	fingerprint, issuer string
	mu                  sync.Mutex
	logs                bytes.Buffer
	done                chan struct{}
	exitErr             error
}

// authorityProc and discoveryProc name what a test runs.
type (
	authorityProc = proc
	discoveryProc = proc
)

func (p *proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// startProc runs the binary with args, which ask for JSON logs, waits for
// the log record whose msg is startedMsg, and returns the process with
// that record; name is how failures refer to it. The process is stopped
// when the test ends.
func startProc(t *testing.T, name, startedMsg string, args ...string) (*proc, map[string]any) {
	t.Helper()
	return startProcEnv(t, name, startedMsg, nil, args...)
}

// startProcEnv is startProc with env added to the clean environment.
func startProcEnv(t *testing.T, name, startedMsg string, env []string, args ...string) (*proc, map[string]any) {
	t.Helper()
	cmd := exec.Command(musterBin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	return startCmd(t, name, startedMsg, cmd)
}

// startCmd is startProc for a command already made (one that runs the
// binary through a shell, say).
func startCmd(t *testing.T, name, startedMsg string, cmd *exec.Cmd) (*proc, map[string]any) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	// Registered before the stop below, so it runs after it: the log
	// printed is whole.
	logsOnFailure(t, name, p.Logs)
	started := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs.WriteString(line + "\n")
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == startedMsg {
				select {
				case started <- rec:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	select {
	case rec := <-started:
		p.listen, _ = rec["listen"].(string)
		p.metrics, _ = rec["metrics_listen"].(string)
		return p, rec
	case <-p.done:
		t.Fatalf("%s exited before starting: %v\n%s", name, p.exitErr, p.Logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not start in 30s\n%s", name, p.Logs())
	}
	return nil, nil
}

// startAuthority starts the authority on OS-chosen loopback ports and waits
// for its "authority started" log line.
func startAuthority(t *testing.T, dir string, extra ...string) *authorityProc {
	t.Helper()
	p, rec := startProc(t, "authority", "authority started", append([]string{"authority", "--data", dir,
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"}, extra...)...)
	p.addr, _ = rec["advertise"].(string)
	p.bootstrap, _ = rec["bootstrap_listen"].(string)
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.exitErr != nil {
			t.Errorf("%s exited with %v after SIGTERM\n%s", p.name, p.exitErr, p.Logs())
		}
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		t.Errorf("%s did not stop within 20s of SIGTERM\n%s", p.name, p.Logs())
	}
}

// logTail is how many of a process's last log lines a failed test prints.
const logTail = 120

// logsOnFailure prints the last logTail lines of a process's log (logs)
// when t has failed. It runs as a cleanup, so after a t.Fatal too: a test
// that fails in CI, where it cannot be watched again, says what the
// processes it started were doing when it gave up.
func logsOnFailure(t *testing.T, name string, logs func() string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		lines := strings.SplitAfter(logs(), "\n")
		if n := len(lines) - logTail; n > 0 {
			lines = append([]string{fmt.Sprintf("(%d lines before)\n", n)}, lines[n:]...)
		}
		t.Logf("the last of %s's log:\n%s", name, strings.Join(lines, ""))
	})
}

// metricsOf scrapes /metrics at addr.
func metricsOf(t *testing.T, addr string) string {
	t.Helper()
	body, err := scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// renewalResult is one line of muster_renewals_total: result, count.
var renewalResult = regexp.MustCompile(`(?m)^muster_renewals_total\{result="([a-z_]+)"\} (\d+)`)

// checkNoRefusedRenewal fails t if an authority's metrics count a refused
// renewal (when names the span checked) and, with wantOK, if they count
// no renewal at all.
func checkNoRefusedRenewal(t *testing.T, metrics, when string, wantOK bool) {
	t.Helper()
	renewed := false
	for _, m := range renewalResult.FindAllStringSubmatch(metrics, -1) {
		switch {
		case m[1] == "ok":
			renewed = m[2] != "0"
		case m[2] != "0":
			t.Errorf("renewals refused %s: %s", when, m[0])
		}
	}
	if wantOK && !renewed {
		t.Fatalf("no renewal counted:\n%s", metrics)
	}
}

// scrape is /metrics at addr, for a goroutine other than the test's,
// where t.Fatal would end only that goroutine.
func scrape(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// execCommand prepares the binary with a clean environment.
func execCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, musterBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	return cmd
}
