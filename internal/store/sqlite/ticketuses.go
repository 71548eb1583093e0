package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// TicketUsed reports whether a referral ticket's jti is recorded, whether
// or not its KeepUntil has passed.
func (s *SQLite) TicketUsed(ctx context.Context, id string) (bool, error) {
	var one int
	err := s.r.lookup(ctx, `SELECT 1 FROM ticket_uses WHERE jti = ?`, id).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, wrap("ticket used", err)
	}
	return true, nil
}

// DeleteTicketUses drops the uses whose KeepUntil is at or before the store
// clock's now and returns how many.
func (s *SQLite) DeleteTicketUses(ctx context.Context) (int64, error) {
	var n int64
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM ticket_uses WHERE keep_until <= `+nowMicros)
		if err != nil {
			return wrap("delete ticket uses", err)
		}
		n, err = res.RowsAffected()
		if err != nil {
			return wrap("delete ticket uses", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
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
// recorded already. The primary key on jti makes it one conditional write.
func useTicket(ctx context.Context, tx *writeTx, u *store.TicketUse, nodeID string) error {
	res, err := tx.ExecContext(ctx, `INSERT INTO ticket_uses (jti, node_id, keep_until, used_at)
		VALUES (?, ?, ?, `+nowMicros+`)
		ON CONFLICT (jti) DO NOTHING`,
		u.ID, nodeID, timeArg(u.KeepUntil))
	if err != nil {
		return wrap("commit join: use ticket", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return wrap("commit join: use ticket", err)
	}
	if n == 0 {
		return fmt.Errorf("sqlite: commit join: ticket %s: %w", u.ID, store.ErrTicketReplayed)
	}
	return nil
}
