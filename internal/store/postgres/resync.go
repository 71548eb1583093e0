package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const resyncColumns = `id, ordinal, opened_at, open_until, closed_at, opened_by, closed_by, reason`

// openWindow is true of a row whose window is open by the database clock.
const openWindow = `closed_at IS NULL AND open_until > ` + nowMicros

func scanResyncEpoch(r pgx.Row) (store.ResyncEpoch, error) {
	var (
		e                       store.ResyncEpoch
		opened, until, closedAt *int64
	)
	err := r.Scan(&e.ID, &e.Ordinal, &opened, &until, &closedAt, &e.OpenedBy, &e.ClosedBy, &e.Reason)
	e.OpenedAt, e.Until, e.ClosedAt = timeCol(opened), timeCol(until), timeCol(closedAt)
	return e, err
}

// OpenResync begins the next epoch in one conditional INSERT that adds no
// row while a window is open. Two replicas opening at once both compute
// the same ordinal; its unique index lets one win (ErrConflict for the
// other).
func (s *Store) OpenResync(ctx context.Context, o store.ResyncOpen) (store.ResyncEpoch, error) {
	e, err := scanResyncEpoch(s.pool.QueryRow(ctx, `INSERT INTO bound_keypair_epochs (id, ordinal, opened_at, open_until, opened_by, reason)
		SELECT $1, next.ordinal, next.now, next.now + $2::bigint, $3, $4
		FROM (SELECT COALESCE(MAX(ordinal), 0) + 1 AS ordinal, `+nowMicros+` AS now FROM bound_keypair_epochs) AS next
		WHERE NOT EXISTS (SELECT 1 FROM bound_keypair_epochs WHERE `+openWindow+`)
		RETURNING `+resyncColumns, o.ID, o.For.Microseconds(), o.OpenedBy, o.Reason))
	if errors.Is(err, pgx.ErrNoRows) {
		return e, fmt.Errorf("postgres: open resync: a window is open: %w", store.ErrConflict)
	}
	if err != nil {
		return e, wrap("open resync", err)
	}
	return e, nil
}

// CloseResync closes the open window in one conditional UPDATE.
func (s *Store) CloseResync(ctx context.Context, closedBy string) (store.ResyncEpoch, error) {
	e, err := scanResyncEpoch(s.pool.QueryRow(ctx, `UPDATE bound_keypair_epochs SET closed_at = `+nowMicros+`, closed_by = $1
		WHERE `+openWindow+` RETURNING `+resyncColumns, closedBy))
	if err != nil {
		return e, wrap("close resync", err)
	}
	return e, nil
}

// ListResyncEpochs returns every epoch, oldest first.
func (s *Store) ListResyncEpochs(ctx context.Context) ([]store.ResyncEpoch, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+resyncColumns+` FROM bound_keypair_epochs ORDER BY ordinal`)
	if err != nil {
		return nil, wrap("list resync epochs", err)
	}
	return collect(rows, "list resync epochs", scanResyncEpoch)
}
