package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// TicketUsed reports whether a referral ticket's jti is recorded, whether
// or not its KeepUntil has passed.
func (s *Store) TicketUsed(ctx context.Context, id string) (bool, error) {
	var one int
	err := s.pool.QueryRow(ctx, `SELECT 1 FROM ticket_uses WHERE jti = $1`, id).Scan(&one)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, wrap("ticket used", err)
	}
	return true, nil
}

// DeleteTicketUses drops the uses whose KeepUntil is at or before the store
// clock's now and returns how many.
func (s *Store) DeleteTicketUses(ctx context.Context) (int64, error) {
	// A cleaner: what expired since it last ran may be many rows, so it
	// is bounded by longRequestTimeout, not the store's request timeout.
	ctx = long(ctx)
	tag, err := s.pool.Exec(ctx, `DELETE FROM ticket_uses WHERE keep_until <= `+nowMicros)
	if err != nil {
		return 0, wrap("delete ticket uses", err)
	}
	return tag.RowsAffected(), nil
}

// checkTicket rejects a ticket use CommitJoin cannot record: an empty jti,
// or no KeepUntil (the record could never be dropped). Either is a bug in
// the caller, not a sentinel.
func checkTicket(u *store.TicketUse) error {
	switch {
	case u == nil:
		return nil
	case u.ID == "":
		return errors.New("referral ticket without a jti")
	case u.KeepUntil.IsZero():
		return fmt.Errorf("referral ticket %s without KeepUntil", u.ID)
	}
	return nil
}

// useTicket records the single use of a referral ticket by the join of
// nodeID, inside CommitJoin's transaction; ErrTicketReplayed if its jti is
// recorded already. It is one INSERT … ON CONFLICT DO NOTHING on the
// primary key: a concurrent use of the same jti waits for the first
// transaction and, if that commits, inserts nothing.
func useTicket(u *store.TicketUse, nodeID string) statement {
	return statement{
		sql: `INSERT INTO ticket_uses (jti, node_id, keep_until, used_at)
			VALUES ($1, $2, $3, ` + nowMicros + `)
			ON CONFLICT (jti) DO NOTHING
			RETURNING true`,
		args: []any{u.ID, nodeID, timeArg(u.KeepUntil)},
		read: func(row pgx.Row) error {
			var inserted bool
			switch err := row.Scan(&inserted); {
			case errors.Is(err, pgx.ErrNoRows):
				return fmt.Errorf("postgres: commit join: ticket %s: %w", u.ID, store.ErrTicketReplayed)
			case err != nil:
				return wrap("commit join: use ticket", err)
			}
			return nil
		},
	}
}
