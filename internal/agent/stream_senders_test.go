package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// heldLog holds the first write containing match until release is closed,
// closing held when it starts to.
type heldLog struct {
	match   string
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (h *heldLog) Write(p []byte) (int, error) {
	if strings.Contains(string(p), h.match) {
		h.once.Do(func() {
			close(h.held)
			<-h.release
		})
	}
	return len(p), nil
}

// TestStreamEndsAfterItsSenders: a stream returns only once the heartbeat
// sender it started has ended. A sender outliving it read the agent's
// directory after keepStream returned — its lock creates certs/ and keys/
// again — so an agent told to stop (agent run's shutdown) still wrote
// there, and a test's TempDir cleanup failed with "directory not empty"
// (TestStreamLockWaitNoticesASuspend).
func TestStreamEndsAfterItsSenders(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	w := &heldLog{match: "heartbeat skipped", held: make(chan struct{}), release: make(chan struct{})}
	a := New(Options{Dir: dir, Timeout: 5 * time.Second, Log: slog.New(slog.NewJSONHandler(w, nil))})
	st, id, err := a.loadLocked(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// The heartbeat cannot read the state: it says so, and the log holds
	// it there while the authority closes the stream.
	if err := os.WriteFile(dir.StateFile(), []byte("not json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.connect = func(musterv1.AgentService_ConnectServer) error {
		<-w.held
		return errors.New("closed")
	}
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	tasks := newTaskRunner(ctx, a)
	defer tasks.wait()
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.serveStream(ctx, st, id, tasks) }()
	select {
	case <-w.held:
	case <-time.After(time.Minute):
		close(w.release)
		t.Fatal("no heartbeat a minute after the stream opened")
	}
	// The authority's close reaches the agent in milliseconds; a stream
	// that returns within these seconds left its heartbeat running. (A
	// slower machine only lets the old defect pass unseen; it cannot fail
	// a correct agent.)
	select {
	case err := <-done:
		close(w.release)
		t.Fatalf("the stream returned (%v) while the heartbeat it started still runs", err)
	case <-time.After(3 * time.Second):
	}
	close(w.release)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the stream still runs a minute after its heartbeat ended")
	}
}
