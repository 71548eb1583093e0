package authority

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// hungStoreDeadline is the own deadline of hungStore's requests: longer
// than the 5 s the jobs below gave their store calls before, as the
// default limits.store_timeout (10 s) is, and short enough for a test.
const hungStoreDeadline = 6 * time.Second

// hungStore is a PostgreSQL store over a database that hangs: each call
// waits for the store's own deadline and then fails as unavailable,
// naming the setting, unless its caller's context ends first.
type hungStore struct{ store.Store }

func (hungStore) wait(ctx context.Context, op string) error {
	t := time.NewTimer(hungStoreDeadline)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("postgres: %s: %w: the database did not answer within %s (limits.store_timeout)", op, store.ErrUnavailable, hungStoreDeadline)
	}
}

func (h hungStore) Now(ctx context.Context) (time.Time, error) {
	return time.Time{}, h.wait(ctx, "now")
}

func (h hungStore) CloseAgentStream(ctx context.Context, _ string, _, _ time.Time) error {
	return h.wait(ctx, "close agent stream")
}

func (h hungStore) RecordTaskResult(ctx context.Context, _, _, _, _ string, _ func(store.AuditHead) (store.AuditRecord, error)) error {
	return h.wait(ctx, "record task result")
}

// TestStoreJobsOutlastTheStoresDeadline: the jobs that call the store
// with no caller waiting (recording a stream's end, a task result, the
// ends left pending, what the replica records as it stops) give a hung
// database the store's own deadline, so they fail with the store's
// unavailability, logged once as the outage with the setting that
// governs it, rather than with a deadline of their own shorter than the
// store's (5 s against the default 10 s), which each logged as
// "context deadline exceeded".
func TestStoreJobsOutlastTheStoresDeadline(t *testing.T) {
	t.Parallel()
	newServer := func(logs *syncBuffer) *Server {
		log := slog.New(slog.NewTextHandler(logs, nil))
		s := &Server{store: hungStore{}, log: log, hub: newStreamHub()}
		s.outage = newStoreOutage(log, func(context.Context) error { return errors.New("still hung") })
		s.streamEnds = newPendingEnds(s.store, log)
		s.streamEnds.unavailable = s.outage.fail
		return s
	}
	stream := func(s *Server) *agentStream {
		st := &agentStream{a: &agentService{s: s}, ctx: context.Background(), c: Caller{ID: spiffeid.ID{Name: "n1"}},
			row: store.AgentStream{NodeID: "n1", ConnectedAt: time.Now().Add(-time.Minute)}}
		return st
	}
	for _, tc := range []struct {
		name string
		job  func(*Server) error
		// logged must be in the log, and nothing says a deadline.
		logged string
	}{
		{"a stream's end", func(s *Server) error { return stream(s).recordEnd() }, ""},
		{"a task result", func(s *Server) error {
			stream(s).recordResult(&musterv1.TaskResult{TaskId: "t1", State: store.TaskOK})
			return nil
		}, "the store is unavailable"},
		{"the pending stream ends", func(s *Server) error {
			s.streamEnds.add("n1", time.Now().Add(-time.Minute), time.Now())
			return s.streamEnds.flush(context.Background())
		}, ""},
		{"the stop", func(s *Server) error {
			s.streamEnds.add("n1", time.Now().Add(-time.Minute), time.Now())
			s.recordStop(time.Now().Add(stopBudget))
			return nil
		}, "the store is unavailable as the authority stops"},
		{"the stop during an outage", func(s *Server) error {
			// Nothing is tried: the stop is not held for the store's
			// deadline (the store here would fail the test's wait).
			s.outage.fail(fmt.Errorf("postgres: now: %w", store.ErrUnavailable))
			s.store = nil
			s.streamEnds.store = nil
			s.recordStop(time.Now().Add(stopBudget))
			return nil
		}, "the store is unavailable as the authority stops (an outage under way)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			s := newServer(&logs)
			err := tc.job(s)
			if err != nil && !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("%s with the database hung: %v, want the store unavailable", tc.name, err)
			}
			l := logs.String()
			if tc.logged != "" && !strings.Contains(l, tc.logged) {
				t.Errorf("the log does not say %q:\n%s", tc.logged, l)
			}
			if tc.logged != "" && !strings.Contains(l, "limits.store_timeout") && !strings.Contains(tc.name, "during an outage") {
				t.Errorf("the log does not name limits.store_timeout:\n%s", l)
			}
			if strings.Contains(l, "deadline exceeded") {
				t.Errorf("the log reports a deadline rather than the store's outage:\n%s", l)
			}
		})
	}
}
