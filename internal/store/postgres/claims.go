package postgres

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// statement is one SQL statement answering with at most one row, and the
// reading of that row: a claim is one, so it travels in a batch with the
// statements around it.
type statement struct {
	sql  string
	args []any
	read func(pgx.Row) error
}

// claimStatement returns the single conditional statement that wins c, or
// fails it, inside a join's or a renewal's transaction. instanceID is the
// join's new instance, nodeID the joining node; both are "" for a renewal,
// whose claims are key bindings only.
//
// A claim whose statement cannot say for certain why it failed returns a
// *lostWrite from its read: the reason is read again by pipe.explain,
// after the rollback, so a refusal may cost a round trip and a success
// never does.
func claimStatement(nodeID, instanceID string, c store.Claim) (statement, error) {
	switch c := c.(type) {
	case store.TokenUse:
		return useToken(c.TokenID), nil
	case store.TicketUse:
		if nodeID == "" {
			return statement{}, errors.New("postgres: a ticket use is a join's: it needs a node")
		}
		return useTicket(&c, nodeID), nil
	case store.KeyBinding:
		return bindKey(instanceID, c), nil
	case store.Recovery:
		if instanceID == "" {
			return statement{}, errors.New("postgres: a recovery is a join: it needs a new instance")
		}
		return recoverToken(instanceID, c), nil
	}
	return statement{}, fmt.Errorf("postgres: unknown claim %T", c)
}

// queueClaims queues the statements of claims on p, in order. A token
// use is preceded by the token's lock, taken shared (see useToken).
func queueClaims(p *pipe, nodeID, instanceID string, claims []store.Claim) error {
	for _, c := range claims {
		st, err := claimStatement(nodeID, instanceID, c)
		if err != nil {
			return err
		}
		if u, ok := c.(store.TokenUse); ok {
			p.exec(tokenUseLockQuery, []any{tokenLockClass, u.TokenID}, wrapped("commit join: lock token"))
		}
		p.row(st.sql, st.args, st.read)
	}
	return nil
}

// lostWrite is the refusal of a conditional write (a claim, a renewal's
// UPDATE) that matched no row, when the row as its statement saw it does
// not say why: the statement's snapshot is from before it waited on the
// row lock of a concurrent writer, whose commit it then found (a use, a
// binding, a deletion). Under READ COMMITTED only a later statement sees
// that commit, so the reason is read by one (pipe.explain), on this
// failure path alone.
type lostWrite struct {
	// why reads the row as committed now and returns the write's
	// sentinel error.
	why statement
}

func (*lostWrite) Error() string { return "postgres: conditional write lost, reason not read" }

// useToken takes one use of a token in one conditional statement, after
// the token's lock taken shared (tokenUseLockQuery, queued before it by
// queueClaims).
//
// A token of N uses (uses_allowed > 0) is one conditional UPDATE of its
// use count. Concurrent uses queue on the token's row lock, held until
// each commits, and PostgreSQL re-evaluates the WHERE clause against the
// row each winner committed, so no two joins can take the last use, on one
// replica or several.
//
// A token of unlimited uses (uses_allowed = 0) has no last use to guard,
// so its use is a row appended to token_uses (migration 0019) if the token
// exists and is unexpired: no row lock, and joins on one token no longer
// wait for each other's commits. What the row lock gave besides the count
// is that a deletion of the token could not commit between a join's check
// and its commit; here the token's advisory lock gives it. Joins take it
// shared, and shared holders do not wait for each other; DeleteToken takes
// it exclusive before it deletes. Under READ COMMITTED each statement sees
// what was committed when it began, and this one begins after the lock
// statement returned, so either
//   - the join held the lock first: the deletion waits for the join to
//     commit (a transaction's locks are released after its commit is
//     visible), then deletes the token and the join's use; or
//   - the deletion held it first: the join waits, and its statement then
//     sees the token gone (ErrNotFound).
//
// No join commits after the deletion that refuses it. The lock manager
// queues a join's shared request behind a deletion already waiting, so a
// deletion waits for the joins in flight only, never for a stream of new
// ones. (A SELECT … FOR SHARE or FOR KEY SHARE of the token's row, or a
// foreign key, which takes the latter, would guard the deletion as well,
// but new row-lock sharers do not queue behind a waiting DELETE, so a busy
// token could keep its deletion waiting as long as joins overlap.) The
// expiry is checked by the store clock when the statement runs, as for a
// token of N uses.
//
// The same statement says, from its snapshot, whether the token exists
// and whether it had a use left: a token absent, or spent, before the
// statement began is refused without another round trip (ErrNotFound,
// ErrTokenSpent). A token of N uses that was usable in the snapshot but
// not once its row lock was had was used up or deleted by a concurrent
// transaction, and the row is read again to tell which.
func useToken(id string) statement {
	usable := `(uses_allowed = 0 OR uses_count < uses_allowed) AND ` + unexpired
	return statement{
		sql: `WITH used AS (UPDATE tokens
				SET uses_count = uses_count + 1, last_used_at = ` + nowMicros + `
				WHERE id = $1 AND uses_allowed > 0 AND uses_count < uses_allowed AND ` + unexpired + `
				RETURNING 1),
			counted AS (INSERT INTO token_uses (token_id, used_at)
				SELECT id, ` + nowMicros + ` FROM tokens WHERE id = $1 AND uses_allowed = 0 AND ` + unexpired + `
				RETURNING 1)
			SELECT EXISTS (SELECT 1 FROM used) OR EXISTS (SELECT 1 FROM counted), EXISTS (SELECT 1 FROM tokens WHERE id = $1),
				EXISTS (SELECT 1 FROM tokens WHERE id = $1 AND ` + usable + `)`,
		args: []any{id},
		read: func(row pgx.Row) error {
			var used, exists, wasUsable bool
			switch err := row.Scan(&used, &exists, &wasUsable); {
			case err != nil:
				return wrap("commit join: use token", err)
			case used:
				return nil
			case !exists:
				return tokenGone(id)
			case !wasUsable:
				return tokenSpent(id)
			}
			return &lostWrite{why: statement{
				sql:  `SELECT EXISTS (SELECT 1 FROM tokens WHERE id = $1)`,
				args: []any{id},
				read: func(row pgx.Row) error {
					var exists bool
					switch err := row.Scan(&exists); {
					case err != nil:
						return wrap("commit join: use token", err)
					case !exists:
						return tokenGone(id)
					}
					return tokenSpent(id)
				},
			}}
		},
	}
}

// tokenUseLockQuery and tokenDeleteLockQuery take a token's advisory lock
// (tokenLockClass, hashtext(id)) for the transaction: shared by each join
// that uses the token, exclusive by its deletion (useToken). A hash
// collision between two IDs only makes a deletion wait for the other
// token's joins.
const (
	tokenUseLockQuery    = `SELECT pg_advisory_xact_lock_shared($1, hashtext($2))`
	tokenDeleteLockQuery = `SELECT pg_advisory_xact_lock($1, hashtext($2))`
)

func tokenGone(id string) error {
	return fmt.Errorf("postgres: commit join: token %s: %w", id, store.ErrNotFound)
}

func tokenSpent(id string) error {
	return fmt.Errorf("postgres: commit join: token %s: %w", id, store.ErrTokenSpent)
}
