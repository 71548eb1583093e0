package signer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// raceStore is a second replica's store: armed, its next step write first
// runs other, a step through the first replica, as when two operators
// take the same step through two replicas at once.
type raceStore struct {
	Store
	other func()
}

func (s *raceStore) ApplySignerChanges(ctx context.Context, expect store.SignerSetID, changes []store.SignerChange, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	if f := s.other; f != nil {
		s.other = nil
		f()
	}
	return s.Store.ApplySignerChanges(ctx, expect, changes, audit)
}

// TestLostRaceAuditedWithTheWayOut: of two operators activating the staged
// signer through two replicas at once, the one whose write comes second
// is refused, and its node_task_signer.activate record is a refusal
// (denied) that says what the operator is told: the signers changed
// concurrently, run muster signer list and try again. Before, it was
// recorded as an error of the authority with the store's words only
// ("apply signer changes: the verifier set is no longer version 2 stepped
// at …: store: conflict"), naming no way out.
func TestLostRaceAuditedWithTheWayOut(t *testing.T) {
	ctx := t.Context()
	a, st, log := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops", CorrelationID: "c-1"}
	if _, err := a.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Stage(ctx, who, time.Hour, time.Hour); err != nil {
		t.Fatal(err)
	}
	raced := &raceStore{Store: st}
	b := NewKeeper(raced, a.custody, log, "prod-a3f2e1", 0)
	raced.other = func() {
		if _, err := a.Activate(ctx, who); err != nil {
			t.Errorf("the first replica's activate: %v", err)
		}
	}
	if _, err := b.Activate(ctx, Actor{Name: "spiffe://td/admin/other", CorrelationID: "c-2"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the second replica's activate = %v, want store.ErrConflict", err)
	}
	last := log.events[len(log.events)-1]
	if last.Action != "node_task_signer.activate" || last.CorrelationID != "c-2" {
		t.Fatalf("last record %+v, want the second activate's", last)
	}
	if last.Result != audit.ResultDenied || !strings.Contains(last.Reason, "run muster signer list and try again") ||
		!strings.Contains(last.Reason, "conflict") {
		t.Fatalf("the lost activate recorded as %s %q, want denied with the way out and the store's words", last.Result, last.Reason)
	}
}
