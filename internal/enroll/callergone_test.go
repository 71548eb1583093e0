package enroll

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// interruptingStore ends the call's context just before the join's write
// and answers with what SQLite answers an interrupted statement, which
// does not wrap ctx.Err(): a client that went away mid-call.
type interruptingStore struct {
	Store
	end func()
}

func (s interruptingStore) CommitJoin(ctx context.Context, j store.Join) (store.JoinResult, error) {
	s.end()
	<-ctx.Done()
	return store.JoinResult{}, errors.New("sqlite: commit join: interrupted (9)")
}

// TestCallerGoneIsAuditedAsSuch: a join whose caller cancels (or whose
// deadline passes) mid-call is audited as canceled or deadline exceeded,
// not as an internal error of the authority, and changes nothing.
func TestCallerGoneIsAuditedAsSuch(t *testing.T) {
	tests := []struct {
		name   string
		ctx    func() (context.Context, func())
		reason string
	}{
		{"canceled", func() (context.Context, func()) { return context.WithCancel(context.Background()) }, ReasonCanceled},
		{"deadline", func() (context.Context, func()) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			short, cancelShort := context.WithTimeout(ctx, time.Millisecond)
			return short, func() { cancelShort(); cancel() }
		}, ReasonDeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, end := tt.ctx()
			defer end()
			end2 := end
			if tt.reason == ReasonDeadlineExceeded {
				end2 = func() {} // the deadline ends it
			}
			e := newEnv(t, func(s Store) Store { return interruptingStore{Store: s, end: end2} })
			tok := e.token(t, 1)
			_, der := csr(t)
			if _, err := e.svc.ExchangeJoinToken(ctx, Request{Source: "192.0.2.1"}, tok.Reveal(), "n1", der); err == nil {
				t.Fatal("join succeeded")
			}
			e.audit.mu.Lock()
			defer e.audit.mu.Unlock()
			if len(e.audit.refused) != 1 {
				t.Fatalf("audited %d refusals, want 1: %+v", len(e.audit.refused), e.audit.refused)
			}
			if got := e.audit.refused[0]; got.Result != audit.ResultError || got.Reason != tt.reason {
				t.Errorf("audited %q %q, want %q %q", got.Result, got.Reason, audit.ResultError, tt.reason)
			}
			if _, err := e.st.GetNode(t.Context(), "n1"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("node written: %v", err)
			}
		})
	}
}

// unavailableStore fails the join's write because the store is unavailable.
type unavailableStore struct{ Store }

func (unavailableStore) CommitJoin(context.Context, store.Join) (store.JoinResult, error) {
	return store.JoinResult{}, fmt.Errorf("postgres: commit join: %w: the database did not answer within 10s", store.ErrUnavailable)
}

// TestUnavailableIsNotAuditedAgain: a join that failed because the store is
// unavailable does not try to write its failure to that store: where the
// store hangs, the attempt cost the caller a second store deadline, and an
// agent's renewal ran past the 30 s it gives one.
func TestUnavailableIsNotAuditedAgain(t *testing.T) {
	e := newEnv(t, func(s Store) Store { return unavailableStore{Store: s} })
	tok := e.token(t, 1)
	_, der := csr(t)
	if _, err := e.svc.ExchangeJoinToken(t.Context(), Request{Source: "192.0.2.1"}, tok.Reveal(), "n1", der); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("join: %v, want ErrUnavailable", err)
	}
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	if len(e.audit.refused) != 0 || len(e.audit.events) != 0 {
		t.Errorf("audited %+v and %+v, want nothing written to the unavailable store", e.audit.refused, e.audit.events)
	}
}
