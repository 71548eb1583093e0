package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "handler.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHandlerEnv(t *testing.T) {
	environ := []string{"PATH=/bin", "HOME=/root", "LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC", "USER=root",
		"MUSTER_BOOTSTRAP_PSK=mpsk_secret", "MUSTER_JOIN_URI=muster+token://a.b@h:1", "MUSTER_JOIN_TOKEN=x",
		"AWS_SECRET_ACCESS_KEY=nope", "SITE_REGION=eu", "SITE_OTHER=no", "muster_data=/x"}
	got := handlerEnv(environ, Handler{Env: []string{"SITE_REGION"}}, task.Envelope{TaskID: "id-1", TaskType: "site.x"})
	want := []string{"PATH=/bin", "HOME=/root", "LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC", "USER=root", "SITE_REGION=eu",
		"MUSTER_TASK_ID=id-1", "MUSTER_TASK_TYPE=site.x"}
	if !slices.Equal(got, want) {
		t.Fatalf("handler environment:\n got %q\nwant %q", got, want)
	}
}

func TestReadTaskHandlers(t *testing.T) {
	for _, c := range []struct {
		name, yaml, err string
		want            Handler
	}{
		{"a path alone", "handlers:\n  site.a: /bin/true\n", "", Handler{Path: "/bin/true"}},
		{"a mapping", "handlers:\n  site.a: {path: /bin/true, env: [SITE_REGION], timeout: 5s}\n", "",
			Handler{Path: "/bin/true", Env: []string{"SITE_REGION"}, Timeout: 5 * time.Second}},
		{"relative path", "handlers:\n  site.a: bin/true\n", "absolute path", Handler{}},
		{"unknown key", "handlers:\n  site.a: {path: /bin/true, args: [x]}\n", "field args not found", Handler{}},
		{"a MUSTER_ variable", "handlers:\n  site.a: {path: /bin/true, env: [MUSTER_BOOTSTRAP_PSK]}\n", "MUSTER_BOOTSTRAP_PSK is refused", Handler{}},
		{"a muster_ variable in lower case", "handlers:\n  site.a: {path: /bin/true, env: [muster_join_uri]}\n", "is refused", Handler{}},
		{"not a name", "handlers:\n  site.a: {path: /bin/true, env: [\"A=B\"]}\n", "not a variable name", Handler{}},
		{"timeout too long", "handlers:\n  site.a: {path: /bin/true, timeout: 2h}\n", "outside", Handler{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Dir(t.TempDir())
			if err := os.WriteFile(d.TaskHandlersFile(), []byte(c.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			h, err := d.ReadTaskHandlers()
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Handlers["site.a"]; got.Path != c.want.Path || got.Timeout != c.want.Timeout || !slices.Equal(got.Env, c.want.Env) {
				t.Fatalf("handler = %+v, want %+v", got, c.want)
			}
		})
	}
}

// alive says whether process pid exists (and is not a zombie we could
// still signal: a killed child of the handler is reaped by init).
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestHandlerTimeLimitKillsTheGroup: a handler that hangs with a child
// holding its output is answered at its time limit, and the child dies
// with it (before, the handler alone was killed and the answer waited for
// the child's end: minutes).
func TestHandlerTimeLimitKillsTheGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	h := Handler{Path: script(t, "echo started\nsleep 600 &\necho $! > "+pidFile+"\nsleep 600\n"), Timeout: time.Second}
	start := time.Now()
	out, err := runHandler(t.Context(), h, task.Envelope{TaskID: "t1", TaskType: "site.hang"})
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "killed at its time limit of 1s") || !strings.Contains(err.Error(), "started") {
		t.Fatalf("runHandler = %q, %v; want the time limit and the output so far", out, err)
	}
	// Bounded far below the child's 600 s: the limit and the wait delay.
	if took > h.Timeout+handlerWaitDelay+20*time.Second {
		t.Fatalf("answered after %s", took)
	}
	childGone(t, pidFile, "the time limit")
}

// childGone reads the PID a handler's script wrote to pidFile and fails
// unless that process is gone within a few seconds.
func childGone(t *testing.T, pidFile, what string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 {
		t.Fatalf("no child PID in %q", b)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid) {
		t.Fatalf("the handler's child %d outlived %s", pid, what)
	}
}

// TestHandlerChildHoldingOutput: a handler that exits 0 leaving a child
// holding its output is answered with what it wrote, handlerWaitDelay
// after its exit, not when the child ends.
func TestHandlerChildHoldingOutput(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	h := Handler{Path: script(t, "echo done\nsleep 600 &\necho $! > "+pidFile+"\n"), Timeout: time.Minute}
	start := time.Now()
	out, err := runHandler(t.Context(), h, task.Envelope{TaskID: "t1", TaskType: "site.bg"})
	if err != nil || out != "done\n" {
		t.Fatalf("runHandler = %q, %v", out, err)
	}
	if took := time.Since(start); took > handlerWaitDelay+20*time.Second {
		t.Fatalf("answered after %s", took)
	}
	// Answered, and the child it left is killed with the rest of its
	// group (before, it ran on with no time limit).
	childGone(t, pidFile, "the handler's answer")
}

// TestHandlerChildLeftRunningKilled: a handler that exits 0 leaving a
// child that does not hold its output is answered at once, and the child
// is killed with its group (before, each such task left one more running).
func TestHandlerChildLeftRunningKilled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	h := Handler{Path: script(t, "echo done\nsleep 600 >/dev/null 2>&1 &\necho $! > "+pidFile+"\n"), Timeout: time.Minute}
	out, err := runHandler(t.Context(), h, task.Envelope{TaskID: "t1", TaskType: "site.bg"})
	if err != nil || out != "done\n" {
		t.Fatalf("runHandler = %q, %v", out, err)
	}
	childGone(t, pidFile, "the handler's answer")
}

// TestHandlerFailedChildKilled: a handler that fails leaving a child is
// answered failed, and the child is killed too.
func TestHandlerFailedChildKilled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	h := Handler{Path: script(t, "sleep 600 >/dev/null 2>&1 &\necho $! > "+pidFile+"\nexit 3\n"), Timeout: time.Minute}
	if _, err := runHandler(t.Context(), h, task.Envelope{TaskID: "t1", TaskType: "site.bg"}); err == nil {
		t.Fatal("runHandler of a failing handler = nil error")
	}
	childGone(t, pidFile, "the handler's failure")
}

// TestTaskRunnerTypesApartAndBounded: a task of one type that does not
// end delays no task of another type; of its own type, taskQueueLen wait
// and the next is answered failed at once, saying why.
func TestTaskRunnerTypesApartAndBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	r := newTaskRunner(ctx, New(Options{Dir: Dir(t.TempDir())}))
	defer func() { cancel(); r.wait() }()
	release := make(chan struct{})
	blocked := func(ctx context.Context) (string, error) {
		select {
		case <-release:
			return "released", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	started := make(chan struct{})
	r.enqueue(acceptedTask{env: task.Envelope{TaskID: "hang-0", TaskType: "site.hang"}, run: func(ctx context.Context) (string, error) {
		close(started)
		return blocked(ctx)
	}})
	<-started
	for i := 1; i <= taskQueueLen+1; i++ {
		r.enqueue(acceptedTask{env: task.Envelope{TaskID: fmt.Sprintf("hang-%d", i), TaskType: "site.hang"}, run: blocked})
	}
	r.enqueue(acceptedTask{env: task.Envelope{TaskID: "report", TaskType: task.TypeReport}, run: func(context.Context) (string, error) { return "{}", nil }})

	got := map[string]*musterv1.TaskResult{}
	collect := func(n int) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for len(got) < n {
			if res := r.next(); res != nil {
				got[res.TaskId] = res
				continue
			}
			select {
			case <-r.ready:
			case <-deadline:
				t.Fatalf("answers so far: %v", got)
			}
		}
	}
	collect(2)
	over := fmt.Sprintf("hang-%d", taskQueueLen+1)
	if res := got["report"]; res == nil || res.State != store.TaskOK {
		t.Fatalf("the report behind a hung task of another type: %v (answers %v)", res, got)
	}
	if res := got[over]; res == nil || res.State != store.TaskFailed || !strings.Contains(res.Detail, "not run") {
		t.Fatalf("the task past the queue: %v (answers %v)", res, got)
	}
	close(release)
	collect(taskQueueLen + 3)
	for i := 0; i <= taskQueueLen; i++ {
		if res := got[fmt.Sprintf("hang-%d", i)]; res == nil || res.State != store.TaskOK {
			t.Errorf("queued task %d: %v", i, res)
		}
	}
}
