package authority

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStopAllStopsListenersAtOnce: the listeners are stopped together, so
// the stop waits one grace, not one per listener: each listener's
// graceful stop here ends only once all of them have started; one after
// the other, the first would have waited out its grace and been stopped
// hard. Listeners whose calls outlast the grace are stopped hard and
// named.
func TestStopAllStopsListenersAtOnce(t *testing.T) {
	t.Parallel()
	names := []string{"api", "bootstrap", "metrics", "crl"}
	t.Run("calls end", func(t *testing.T) {
		t.Parallel()
		var started sync.WaitGroup
		started.Add(len(names))
		var ls []stoppable
		for _, n := range names {
			ls = append(ls, stoppable{name: n, hard: func() {}, graceful: func(ctx context.Context) error {
				started.Done()
				all := make(chan struct{})
				go func() { started.Wait(); close(all) }()
				select {
				case <-all:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}})
		}
		if cut := stopAll(time.Now().Add(time.Minute), ls); len(cut) != 0 {
			t.Errorf("stopped hard: %v, want none (the listeners were stopped one after the other)", cut)
		}
	})
	t.Run("calls outlast the grace", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		var hard []string
		var ls []stoppable
		for _, n := range names {
			ls = append(ls, stoppable{name: n,
				hard:     func() { mu.Lock(); hard = append(hard, n); mu.Unlock() },
				graceful: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }})
		}
		cut := stopAll(time.Now().Add(100*time.Millisecond), ls)
		slices.Sort(hard)
		want := slices.Sorted(slices.Values(names))
		if !slices.Equal(cut, names) || !slices.Equal(hard, want) {
			t.Errorf("cut %v, stopped hard %v; want every listener: %v", cut, hard, names)
		}
	})
}

// TestRecordStopWithinBudget: with the database hung, the stop's record
// gives up when the stop's budget ends, not after the store's own
// deadline (hungStoreDeadline, as limits.store_timeout would be), and
// says what it did not record and why.
func TestRecordStopWithinBudget(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s := &Server{store: hungStore{}, log: log, hub: newStreamHub()}
	s.outage = newStoreOutage(log, func(context.Context) error { return errors.New("still hung") })
	s.streamEnds = newPendingEnds(s.store, log)
	s.streamEnds.unavailable = s.outage.fail
	s.streamEnds.add("n1", time.Now().Add(-time.Minute), time.Now())
	s.recordStop(time.Now().Add(200 * time.Millisecond))
	if l := logs.String(); !strings.Contains(l, "the authority's stop took its whole 20s") || !strings.Contains(l, "not recorded: the ends of agent streams") {
		t.Errorf("the log does not say the budget ran out and what was not recorded:\n%s", l)
	}
}

// TestUnitStopTimeoutCoversTheStop: the systemd unit gives the stop more
// than stopBudget, or the service manager kills the authority before its
// stop is recorded.
func TestUnitStopTimeoutCoversTheStop(t *testing.T) {
	unit, err := os.ReadFile("../../packaging/systemd/muster-authority.service")
	if err != nil {
		t.Fatal(err)
	}
	var timeout time.Duration
	for l := range strings.Lines(string(unit)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "TimeoutStopSec="); ok {
			if timeout, err = time.ParseDuration(v); err != nil {
				t.Fatalf("TimeoutStopSec=%s: %v", v, err)
			}
		}
	}
	if timeout <= stopBudget {
		t.Errorf("the unit's TimeoutStopSec is %s, want more than the stop's budget, %s", timeout, stopBudget)
	}
}
