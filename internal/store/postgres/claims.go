package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// applyClaim wins one claim of a join or renewal inside its transaction,
// or fails with the claim's sentinel (see store.Claim). instanceID is the
// join's new instance, "" for a renewal.
func applyClaim(ctx context.Context, tx pgx.Tx, nodeID, instanceID string, c store.Claim) error {
	switch c := c.(type) {
	case store.TokenUse:
		return useToken(ctx, tx, c.TokenID)
	case store.TicketUse:
		return useTicket(ctx, tx, &c, nodeID)
	case store.KeyBinding:
		return bindKey(ctx, tx, instanceID, c)
	case store.Recovery:
		if instanceID == "" {
			return errors.New("postgres: a recovery is a join: it needs a new instance")
		}
		return recoverToken(ctx, tx, instanceID, c)
	default:
		return fmt.Errorf("postgres: commit join: unknown claim %T", c)
	}
}

// useToken takes one use of a token in one conditional UPDATE. Concurrent
// uses queue on the token's row lock, and PostgreSQL re-evaluates the
// WHERE clause against the row each winner committed, so no two joins can
// take the last use.
func useToken(ctx context.Context, tx pgx.Tx, id string) error {
	tag, err := tx.Exec(ctx, `UPDATE tokens
		SET uses_count = uses_count + 1, last_used_at = `+nowMicros+`
		WHERE id = $1 AND (uses_allowed = 0 OR uses_count < uses_allowed) AND `+unexpired,
		id)
	if err != nil {
		return wrap("commit join: use token", err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	ok, err := exists(ctx, tx, "tokens", id)
	switch {
	case err != nil:
		return wrap("commit join: use token", err)
	case !ok:
		return fmt.Errorf("postgres: commit join: token %s: %w", id, store.ErrNotFound)
	default:
		return fmt.Errorf("postgres: commit join: token %s: %w", id, store.ErrTokenSpent)
	}
}
