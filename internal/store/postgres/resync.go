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
// other). The INSERT goes first, then the audit record built on the
// epoch it wrote, with COMMIT: one transaction.
func (s *Store) OpenResync(ctx context.Context, o store.ResyncOpen, audit func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	if audit == nil {
		return store.ResyncEpoch{}, fmt.Errorf("postgres: open resync: no audit record: a window is never opened unaudited")
	}
	return s.epochAudited(ctx, "open resync", `INSERT INTO bound_keypair_epochs (id, ordinal, opened_at, open_until, opened_by, reason)
		SELECT $1, next.ordinal, next.now, next.now + $2::bigint, $3, $4
		FROM (SELECT COALESCE(MAX(ordinal), 0) + 1 AS ordinal, `+nowMicros+` AS now FROM bound_keypair_epochs) AS next
		WHERE NOT EXISTS (SELECT 1 FROM bound_keypair_epochs WHERE `+openWindow+`)
		RETURNING `+resyncColumns, []any{o.ID, o.For.Microseconds(), o.OpenedBy, o.Reason},
		fmt.Errorf("postgres: open resync: a window is open: %w", store.ErrConflict), audit)
}

// CloseResync closes the open window in one conditional UPDATE, with its
// audit record in the same transaction.
func (s *Store) CloseResync(ctx context.Context, closedBy string, audit func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	if audit == nil {
		return store.ResyncEpoch{}, fmt.Errorf("postgres: close resync: no audit record: a window is never closed unaudited")
	}
	return s.epochAudited(ctx, "close resync", `UPDATE bound_keypair_epochs SET closed_at = `+nowMicros+`, closed_by = $1
		WHERE `+openWindow+` RETURNING `+resyncColumns, []any{closedBy}, wrap("close resync", pgx.ErrNoRows), audit)
}

// epochAudited runs a write of one epoch row, which returns it (none is
// refused with none), then appends the record audit builds for that
// epoch and commits.
func (s *Store) epochAudited(ctx context.Context, op, sql string, args []any, none error, audit func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error)) (store.ResyncEpoch, error) {
	var e store.ResyncEpoch
	err := s.inPipe(ctx, op, func(p *pipe) error {
		p.row(sql, args, func(row pgx.Row) error {
			var err error
			e, err = scanResyncEpoch(row)
			if errors.Is(err, pgx.ErrNoRows) {
				return none
			}
			if err != nil {
				return wrap(op, err)
			}
			return nil
		})
		if err := p.send(ctx); err != nil {
			return err
		}
		build := audit(e)
		if build == nil {
			return fmt.Errorf("postgres: %s %s: no audit record: a window never changes unaudited", op, e.ID)
		}
		return commitAudited(ctx, p, build, op+" "+e.ID)
	})
	if err != nil {
		return store.ResyncEpoch{}, err
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
