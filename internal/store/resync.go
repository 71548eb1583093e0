package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrResyncClosed: a resync (a Recovery with Resync) found its epoch's
// window closed or expired by the store clock.
var ErrResyncClosed = errors.New("store: resync window closed")

// ResyncEpoch is one bound-keypair resync window an operator opened after
// restoring the store, and the authority epoch it begins. Every join state
// document names the epoch of its token; a document of an epoch the store
// does not know was signed after the backup the store was restored from.
// The initial epoch (before any window) is "" with ordinal 0 and has no
// row.
type ResyncEpoch struct {
	ID       string
	Ordinal  int64 // 1, 2, …: the order windows were opened in
	OpenedAt time.Time
	Until    time.Time // the window closes by itself at Until
	ClosedAt time.Time // zero unless closed early
	OpenedBy string
	ClosedBy string
	Reason   string
}

// OpenAt reports whether the window is open at now.
func (e ResyncEpoch) OpenAt(now time.Time) bool {
	return e.ClosedAt.IsZero() && now.Before(e.Until)
}

// ResyncOpen is what opening a window records.
type ResyncOpen struct {
	ID       string
	For      time.Duration // the window ends this long after the store clock's now
	OpenedBy string
	Reason   string
}

// ResyncStore holds the resync windows. All methods are safe for concurrent
// use, also from several replicas.
type ResyncStore interface {
	// OpenResync begins a new epoch with a window open for o.For, in one
	// conditional write: ErrConflict if a window is open (by the store
	// clock) or another opening won a race. audit(e), e the epoch as
	// written, builds its record (bound_keypair.resync.open), appended in
	// the same transaction (see Store.AppendAudit): an error building or
	// appending it is returned and nothing is written; a nil audit, or
	// one returning nil, is refused.
	OpenResync(ctx context.Context, o ResyncOpen, audit func(e ResyncEpoch) func(head AuditHead) (AuditRecord, error)) (ResyncEpoch, error)
	// CloseResync closes the open window early; ErrNotFound if none is
	// open. audit(e), e the epoch as closed, builds its record
	// (bound_keypair.resync.close), appended in the same transaction as
	// OpenResync's: an error building or appending it is returned and
	// the window stays open.
	CloseResync(ctx context.Context, closedBy string, audit func(e ResyncEpoch) func(head AuditHead) (AuditRecord, error)) (ResyncEpoch, error)
	// ListResyncEpochs returns every epoch, oldest first.
	ListResyncEpochs(ctx context.Context) ([]ResyncEpoch, error)
}

// RecoveryFailed names the condition a Recovery claim's conditional write
// failed on, given the token's sequence and epoch as the write found them:
// for the backends, which apply the claim alike.
func RecoveryFailed(backend string, c Recovery, seq int64, epoch string) error {
	switch {
	case seq != c.ExpectedSequence || epoch != c.ExpectedEpoch:
		return fmt.Errorf("%s: recover: token %s: %w", backend, c.TokenID, ErrRecoverySequenceChanged)
	case c.Resync:
		return fmt.Errorf("%s: recover: token %s: %w", backend, c.TokenID, ErrResyncClosed)
	default:
		return fmt.Errorf("%s: recover: token %s: %w", backend, c.TokenID, ErrRecoveryExhausted)
	}
}
