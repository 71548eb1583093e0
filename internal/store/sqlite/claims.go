package sqlite

import (
	"context"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// applyClaim wins one claim of a join inside its write transaction, or
// fails with the claim's sentinel (see store.Claim).
func applyClaim(ctx context.Context, tx *writeTx, j store.Join, c store.Claim) error {
	switch c := c.(type) {
	case store.TokenUse:
		return useToken(ctx, tx, c.TokenID)
	case store.TicketUse:
		return useTicket(ctx, tx, &c, j.NodeID)
	default:
		return fmt.Errorf("sqlite: commit join: unknown claim %T", c)
	}
}

// useToken takes one use of a token in one conditional UPDATE that
// succeeds only if the token is unexpired and has a use left by the store
// clock, so no two joins can both take its last use, even from two
// processes.
func useToken(ctx context.Context, tx *writeTx, id string) error {
	res, err := tx.ExecContext(ctx, `UPDATE tokens
		SET uses_count = uses_count + 1, last_used_at = `+nowMicros+`
		WHERE id = ? AND (uses_allowed = 0 OR uses_count < uses_allowed) AND `+unexpired,
		id)
	if err != nil {
		return wrap("commit join: use token", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return wrap("commit join: use token", err)
	}
	if n > 0 {
		return nil
	}
	ok, err := exists(ctx, tx, "tokens", id)
	switch {
	case err != nil:
		return wrap("commit join: use token", err)
	case !ok:
		return fmt.Errorf("sqlite: commit join: token %s: %w", id, store.ErrNotFound)
	default:
		return fmt.Errorf("sqlite: commit join: token %s: %w", id, store.ErrTokenSpent)
	}
}
