package authority

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/muster-dev/muster/internal/store"
)

// TestStreamHub: a change wakes the streams of the nodes it names, or
// every stream, with the kinds it carries; kinds that arrive before the
// stream takes them fold into one wake-up.
func TestStreamHub(t *testing.T) {
	for _, c := range []struct {
		name    string
		changes []store.Change
		want    map[string]store.ChangeKind // by stream; absent: not woken
	}{
		{"one node's task", []store.Change{{Kind: store.ChangeTasks, Nodes: []string{"a"}}},
			map[string]store.ChangeKind{"a": store.ChangeTasks, "a2": store.ChangeTasks}},
		{"a lock wakes every stream", []store.Change{{Kind: store.ChangeStanding}},
			map[string]store.ChangeKind{"a": store.ChangeStanding, "a2": store.ChangeStanding, "b": store.ChangeStanding}},
		{"kinds fold", []store.Change{{Kind: store.ChangeTasks, Nodes: []string{"b"}}, {Kind: store.ChangeSigners}},
			map[string]store.ChangeKind{"a": store.ChangeSigners, "a2": store.ChangeSigners, "b": store.ChangeTasks | store.ChangeSigners}},
		{"a node without a stream", []store.Change{{Kind: store.ChangeStanding, Nodes: []string{"z"}}}, map[string]store.ChangeKind{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newStreamHub()
			// Two streams of node a (the agent reconnected), one of b.
			subs := map[string]*streamWake{}
			for name, node := range map[string]string{"a": "a", "a2": "a", "b": "b"} {
				w, unsubscribe := h.subscribe(node)
				t.Cleanup(unsubscribe)
				subs[name] = w
			}
			for _, ch := range c.changes {
				h.notify(ch)
			}
			for name, w := range subs {
				select {
				case <-w.c:
					if got := w.take(); got != c.want[name] {
						t.Errorf("stream %s woken for %b, want %b", name, got, c.want[name])
					}
				default:
					if k, ok := c.want[name]; ok {
						t.Errorf("stream %s not woken, want %b", name, k)
					}
				}
			}
		})
	}
	h := newStreamHub()
	_, unsubscribe := h.subscribe("a")
	unsubscribe()
	if len(h.byNode) != 0 {
		t.Fatalf("a node's entry outlives its last stream: %v", h.byNode)
	}
}

// flakyWatcher fails its first WatchChanges, as a lost connection does,
// then listens.
type flakyWatcher struct {
	store.Store
	calls int
}

func (f *flakyWatcher) WatchChanges(ctx context.Context, notify func(store.Change)) error {
	f.calls++
	if f.calls == 1 {
		return errors.New("connection lost")
	}
	notify(store.Change{Kind: store.ChangeAll})
	<-ctx.Done()
	return nil
}

// TestWatchChangesListensAgain: after the store's watch fails, the
// authority listens again, counts the loss, and every stream is woken for
// everything once it listens.
func TestWatchChangesListensAgain(t *testing.T) {
	m, err := newStreamMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{store: &flakyWatcher{}, hub: newStreamHub(), streams: m, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w, unsubscribe := s.hub.subscribe("a")
	defer unsubscribe()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.watchChanges(ctx); close(done) }()
	select {
	case <-w.c:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream was not woken after the watch was restored")
	}
	if got := w.take(); got != store.ChangeAll {
		t.Fatalf("woken for %b, want everything", got)
	}
	if n := metricValue(m.watchLost); n != 1 {
		t.Fatalf("muster_change_watch_lost_total = %v, want 1", n)
	}
	cancel()
	<-done
}

// outageWatcher listens, then loses its connection and fails to listen
// again failures times (the database down), then listens until ctx ends.
type outageWatcher struct {
	store.Store
	failures int
	calls    atomic.Int64
}

func (f *outageWatcher) WatchChanges(ctx context.Context, notify func(store.Change)) error {
	n := int(f.calls.Add(1))
	if n > 1 && n <= 1+f.failures {
		return errors.New("dial tcp: connection refused")
	}
	notify(store.Change{Kind: store.ChangeAll})
	if n == 1 {
		return errors.New("unexpected EOF") // the database went down
	}
	<-ctx.Done()
	return nil
}

// TestWatchChangesOutage: through a database outage of many failed
// attempts, the loss is counted and logged once, listening again is logged
// once, and the attempts stay at most a second apart, so the replica
// listens again soon after the database is back (ten failures with the
// old backoff, doubling to 5 s, took at least 13 s).
func TestWatchChangesOutage(t *testing.T) {
	t.Parallel()
	m, err := newStreamMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	f := &outageWatcher{failures: 10}
	s := &Server{store: f, hub: newStreamHub(), streams: m, log: slog.New(slog.NewTextHandler(&logs, nil))}
	w, unsubscribe := s.hub.subscribe("a")
	defer unsubscribe()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.watchChanges(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for f.calls.Load() < 12 || !strings.Contains(logs.String(), "listening again to") {
		if time.Now().After(deadline) {
			t.Fatalf("after %d attempts in 10 s the replica does not listen again", f.calls.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := w.take(); got != store.ChangeAll {
		t.Errorf("woken for %b once listening again, want everything", got)
	}
	cancel()
	<-done
	if n := metricValue(m.watchLost); n != 1 {
		t.Errorf("muster_change_watch_lost_total = %v after one outage, want 1", n)
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Errorf("%d warnings for one outage, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "listening again to the store's change notifications"); n != 1 {
		t.Errorf("listening again logged %d times, want once:\n%s", n, out)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
