package sqlite

import (
	"context"
	"errors"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// applyClaim wins one claim of a join or renewal inside its write
// transaction, or fails with the claim's sentinel (see store.Claim).
// instanceID is the join's new instance, "" for a renewal.
func applyClaim(ctx context.Context, tx *writeTx, nodeID, instanceID string, c store.Claim) error {
	switch c := c.(type) {
	case store.TokenUse:
		return useToken(ctx, tx, c.TokenID)
	case store.TicketUse:
		return useTicket(ctx, tx, &c, nodeID)
	case store.KeyBinding:
		return bindKey(ctx, tx, instanceID, c)
	case store.Recovery:
		if instanceID == "" {
			return errors.New("sqlite: a recovery is a join: it needs a new instance")
		}
		return recoverToken(ctx, tx, instanceID, c)
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
