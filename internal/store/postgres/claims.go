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
func applyClaim(ctx context.Context, tx querier, nodeID, instanceID string, c store.Claim) error {
	if st, ok := claimStatement(nodeID, c); ok {
		return st.read(tx.QueryRow(ctx, st.sql, st.args...))
	}
	switch c := c.(type) {
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

// statement is one SQL statement answering with at most one row, and the
// reading of that row: a claim that is one, so it can travel in a batch
// with the statements around it.
type statement struct {
	sql  string
	args []any
	read func(pgx.Row) error
}

// claimStatement returns the claims that are a single statement whose
// answer says which condition failed: a token use and a ticket use. The
// others (key bindings, recoveries) read the row again to say why they
// failed, and run on their own.
func claimStatement(nodeID string, c store.Claim) (statement, bool) {
	switch c := c.(type) {
	case store.TokenUse:
		return useToken(c.TokenID), true
	case store.TicketUse:
		return useTicket(&c, nodeID), true
	}
	return statement{}, false
}

// useToken takes one use of a token in one conditional UPDATE. Concurrent
// uses queue on the token's row lock, and PostgreSQL re-evaluates the
// WHERE clause against the row each winner committed, so no two joins can
// take the last use. The same statement says whether the token exists, so
// a failed use is told apart (ErrTokenSpent, ErrNotFound) without a
// second round trip.
func useToken(id string) statement {
	return statement{
		sql: `WITH used AS (UPDATE tokens
				SET uses_count = uses_count + 1, last_used_at = ` + nowMicros + `
				WHERE id = $1 AND (uses_allowed = 0 OR uses_count < uses_allowed) AND ` + unexpired + `
				RETURNING 1)
			SELECT EXISTS (SELECT 1 FROM used), EXISTS (SELECT 1 FROM tokens WHERE id = $1)`,
		args: []any{id},
		read: func(row pgx.Row) error {
			var used, exists bool
			switch err := row.Scan(&used, &exists); {
			case err != nil:
				return wrap("commit join: use token", err)
			case used:
				return nil
			case !exists:
				return fmt.Errorf("postgres: commit join: token %s: %w", id, store.ErrNotFound)
			default:
				return fmt.Errorf("postgres: commit join: token %s: %w", id, store.ErrTokenSpent)
			}
		},
	}
}
