package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

const resyncColumns = `id, ordinal, opened_at, open_until, closed_at, opened_by, closed_by, reason`

// openWindow is true of a row whose window is open by the store clock.
const openWindow = `closed_at IS NULL AND open_until > ` + nowMicros

func scanResyncEpoch(r scanner) (store.ResyncEpoch, error) {
	var (
		e                       store.ResyncEpoch
		opened, until, closedAt sql.NullInt64
	)
	err := r.Scan(&e.ID, &e.Ordinal, &opened, &until, &closedAt, &e.OpenedBy, &e.ClosedBy, &e.Reason)
	e.OpenedAt, e.Until, e.ClosedAt = timeCol(opened), timeCol(until), timeCol(closedAt)
	return e, err
}

// OpenResync begins the next epoch in one conditional INSERT that adds no
// row while a window is open, with its audit record in the same write.
func (s *SQLite) OpenResync(ctx context.Context, o store.ResyncOpen, audit func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	if audit == nil {
		return store.ResyncEpoch{}, fmt.Errorf("sqlite: open resync: no audit record: a window is never opened unaudited")
	}
	var e store.ResyncEpoch
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO bound_keypair_epochs (id, ordinal, opened_at, open_until, opened_by, reason)
			SELECT ?, next.ordinal, next.now, next.now + ?, ?, ?
			FROM (SELECT COALESCE(MAX(ordinal), 0) + 1 AS ordinal, `+nowMicros+` AS now FROM bound_keypair_epochs) AS next
			WHERE NOT EXISTS (SELECT 1 FROM bound_keypair_epochs WHERE `+openWindow+`)`,
			o.ID, o.For.Microseconds(), o.OpenedBy, o.Reason)
		if err != nil {
			return wrap("open resync", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return wrap("open resync", err)
		} else if n == 0 {
			return fmt.Errorf("sqlite: open resync: a window is open: %w", store.ErrConflict)
		}
		if e, err = scanResyncEpoch(tx.QueryRowContext(ctx, `SELECT `+resyncColumns+` FROM bound_keypair_epochs WHERE id = ?`, o.ID)); err != nil {
			return wrap("open resync", err)
		}
		return appendEpochAudit(ctx, tx, "open resync", e, audit)
	})
	if err != nil {
		return store.ResyncEpoch{}, err
	}
	return e, nil
}

// CloseResync closes the open window in one conditional UPDATE, with its
// audit record in the same write.
func (s *SQLite) CloseResync(ctx context.Context, closedBy string, audit func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	if audit == nil {
		return store.ResyncEpoch{}, fmt.Errorf("sqlite: close resync: no audit record: a window is never closed unaudited")
	}
	var e store.ResyncEpoch
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var err error
		e, err = scanResyncEpoch(tx.QueryRowContext(ctx, `UPDATE bound_keypair_epochs SET closed_at = `+nowMicros+`, closed_by = ?
			WHERE `+openWindow+` RETURNING `+resyncColumns, closedBy))
		if err != nil {
			return wrap("close resync", err)
		}
		return appendEpochAudit(ctx, tx, "close resync", e, audit)
	})
	if err != nil {
		return store.ResyncEpoch{}, err
	}
	return e, nil
}

// appendEpochAudit appends the record audit builds for e in tx.
func appendEpochAudit(ctx context.Context, tx *writeTx, op string, e store.ResyncEpoch, audit func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) error {
	build := audit(e)
	if build == nil {
		return fmt.Errorf("sqlite: %s %s: no audit record: a window never changes unaudited", op, e.ID)
	}
	return appendAuditOf(ctx, tx, op+" "+e.ID, build)
}

// ListResyncEpochs returns every epoch, oldest first.
func (s *SQLite) ListResyncEpochs(ctx context.Context) ([]store.ResyncEpoch, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+resyncColumns+` FROM bound_keypair_epochs ORDER BY ordinal`)
	if err != nil {
		return nil, wrap("list resync epochs", err)
	}
	return collect(rows, "list resync epochs", scanResyncEpoch)
}
