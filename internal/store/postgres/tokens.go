package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

const tokenColumns = `id, join_method, ciphertext, nonce, uses_allowed, uses_count, expires_at,
	node_id, description, labels, created_by, created_at, last_used_at, svid_usage`

// tokenReadColumns are tokenColumns as the admin API reads them, from a
// query over tokens: a token of unlimited uses adds its rows in
// token_uses to uses_count, and their newest to last_used_at (see
// useToken). ReadJoin reads tokenColumns: a join needs neither figure
// (an unlimited token cannot be used up), and counting a busy token's
// uses would cost each join more the more it had.
const tokenReadColumns = `id, join_method, ciphertext, nonce, uses_allowed,
	uses_count + CASE WHEN uses_allowed = 0
		THEN (SELECT count(*) FROM token_uses u WHERE u.token_id = tokens.id) ELSE 0 END,
	expires_at, node_id, description, labels, created_by, created_at,
	CASE WHEN uses_allowed = 0
		THEN GREATEST(last_used_at, (SELECT max(used_at) FROM token_uses u WHERE u.token_id = tokens.id))
		ELSE last_used_at END,
	svid_usage`

// InsertToken adds a token; ErrConflict if its ID exists. UsesCount and
// LastUsedAt are stored as given, so a token can be carried over from
// another store.
func (s *Store) InsertToken(ctx context.Context, t store.Token, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: insert token %s: no audit record: a token is never created unaudited", t.ID)
	}
	labels, err := labelsArg(t.Labels)
	if err != nil {
		return fmt.Errorf("postgres: insert token: %w", err)
	}
	if t.BoundKeypair != nil && t.JoinMethod != store.JoinMethodBoundKeypair {
		return fmt.Errorf("postgres: insert token %s: only a bound-keypair token has BoundKeypair", t.ID)
	}
	op := "insert token " + t.ID
	return s.inPipe(ctx, op, func(p *pipe) error {
		// Uses left by a deleted token of the same ID (one the cleaner
		// removed while a join of it was committing) are not this one's;
		// if the ID is taken, the INSERT fails and this is undone.
		p.exec(`DELETE FROM token_uses WHERE token_id = $1`, []any{t.ID}, wrapped("insert token"))
		p.exec(`INSERT INTO tokens (`+tokenColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13, $14)`,
			[]any{t.ID, t.JoinMethod, t.Ciphertext, t.Nonce, t.UsesAllowed, t.UsesCount, timeArg(t.ExpiresAt),
				t.NodeID, t.Description, labels, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.LastUsedAt), t.SVIDUsageOrDefault()},
			wrapped("insert token"))
		if t.BoundKeypair != nil {
			queueBoundKeypair(p, t.ID, t.BoundKeypair)
		}
		return commitAudited(ctx, p, audit, op)
	})
}

// GetToken returns a token, expired or not; ErrNotFound if there is none
// with that ID. It is the admin API's read: a join reads its token with
// ReadJoin, whose decoy row keeps an unknown ID from answering sooner.
func (s *Store) GetToken(ctx context.Context, id string) (store.Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `SELECT `+tokenReadColumns+` FROM tokens WHERE id = $1`, id))
	if err != nil {
		return store.Token{}, wrap("get token "+id, err)
	}
	ts := []store.Token{t}
	if err := withBoundKeypairs(ctx, s.pool, ts); err != nil {
		return store.Token{}, wrap("get token "+id, err)
	}
	return ts[0], nil
}

// ListTokens returns every token, expired or not, oldest first (ties by
// ID): ListTokensPage's order, in one page.
func (s *Store) ListTokens(ctx context.Context) ([]store.Token, error) {
	return s.ListTokensPage(ctx, store.TokenKey{}, math.MaxInt)
}

// DeleteToken removes a token and its uses; ErrNotFound if there is none
// with that ID. Nodes, instances and certificates name the token by ID
// only, so they are left as they are. It takes the token's lock exclusive
// first, so it waits for the joins using the token that are in flight and
// no join of it commits after it (useToken); the statements after the lock
// see those joins' uses.
func (s *Store) DeleteToken(ctx context.Context, id string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: delete token %s: no audit record: a token is never deleted unaudited", id)
	}
	op := "delete token " + id
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(tokenDeleteLockQuery, []any{tokenLockClass, id}, wrapped(op+": lock"))
		p.exec(`DELETE FROM token_uses WHERE token_id = $1`, []any{id}, wrapped(op))
		p.exec(`DELETE FROM tokens WHERE id = $1`, []any{id}, func(tag pgconn.CommandTag, err error) error {
			if err == nil && tag.RowsAffected() == 0 {
				err = pgx.ErrNoRows
			}
			if err != nil {
				return wrap(op, err)
			}
			return nil
		})
		return commitAudited(ctx, p, audit, op)
	})
}

// RaiseTokenUses sets a token's use count to uses, at most its allowed
// uses, where that raises it. A token of limited uses counts them in its
// row (useToken), whose lock the update takes: a join in flight commits
// its use first, or finds the raised count. Whether the token is there is
// read in the same statement, to tell a token gone from one counting the
// uses already.
func (s *Store) RaiseTokenUses(ctx context.Context, id string, uses int64, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "raise token uses " + id
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: a token's uses are never changed unaudited", op)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.row(`WITH raised AS (UPDATE tokens SET uses_count = LEAST($2::bigint, uses_allowed)
				WHERE id = $1 AND uses_allowed > 0 AND uses_count < LEAST($2::bigint, uses_allowed) RETURNING id)
			SELECT EXISTS (SELECT 1 FROM raised), EXISTS (SELECT 1 FROM tokens WHERE id = $1)`, []any{id, uses},
			func(row pgx.Row) error {
				var raised, there bool
				if err := row.Scan(&raised, &there); err != nil {
					return wrap(op, err)
				}
				switch {
				case !there:
					return wrap(op, pgx.ErrNoRows)
				case !raised:
					return fmt.Errorf("postgres: %s: %w: it has unlimited uses or counts %d already", op, store.ErrConflict, uses)
				}
				return nil
			})
		return commitAudited(ctx, p, audit, op)
	})
}

// DeleteExpiredTokens removes the tokens whose expiry is at least retention
// before the store clock and returns their IDs in ascending order. A
// negative retention counts as zero, so no token still in force is ever
// removed. Bound-keypair tokens are left alone: an agent holding one
// recovers through it, and only an operator removes it.
func (s *Store) DeleteExpiredTokens(ctx context.Context, retention time.Duration, audit func(ids []string) func(store.AuditHead) (store.AuditRecord, error)) ([]string, error) {
	const op = "delete expired tokens"
	if audit == nil {
		return nil, fmt.Errorf("postgres: %s: no audit record: a token is never deleted unaudited", op)
	}
	// A cleaner: what expired since it last ran may be many rows, so it
	// is bounded by longRequestTimeout, not the store's request timeout.
	ctx = long(ctx)
	// The expired tokens' uses go with them. No join is using such a
	// token (it refuses an expired one), so this takes no token's lock; a
	// use committed by a join that checked the expiry just before it
	// passed may outlive the token, and InsertToken drops it.
	// The deletion and its record (token.cleanup) are one transaction.
	return s.sweepAudited(ctx, op, `WITH gone AS (DELETE FROM tokens
			WHERE expires_at IS NOT NULL AND expires_at <= `+nowMicros+` - $1 AND join_method <> 'bound-keypair'
			RETURNING id),
		uses AS (DELETE FROM token_uses WHERE token_id IN (SELECT id FROM gone))
		SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM gone`, []any{max(retention, 0).Microseconds()},
		audit, "a token is never deleted unaudited")
}

func scanToken(row pgx.Row) (store.Token, error) {
	var (
		t                        store.Token
		labels                   []byte
		expires, created, usedAt *int64
	)
	if err := row.Scan(&t.ID, &t.JoinMethod, &t.Ciphertext, &t.Nonce, &t.UsesAllowed, &t.UsesCount, &expires,
		&t.NodeID, &t.Description, &labels, &t.CreatedBy, &created, &usedAt, &t.SVIDUsage); err != nil {
		return store.Token{}, err
	}
	if err := json.Unmarshal(labels, &t.Labels); err != nil {
		return store.Token{}, fmt.Errorf("token %s: labels: %w", t.ID, err)
	}
	if len(t.Labels) == 0 {
		t.Labels = nil
	}
	t.ExpiresAt, t.CreatedAt, t.LastUsedAt = timeCol(expires), timeCol(created), timeCol(usedAt)
	if t.SVIDUsage == store.SVIDUsageClient {
		t.SVIDUsage = "" // the default reads as unset
	}
	return t, nil
}

// labelsArg encodes labels as a JSON object; no labels are "{}", never
// NULL.
func labelsArg(labels map[string]string) (string, error) {
	if len(labels) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(labels)
	if err != nil {
		return "", fmt.Errorf("labels: %w", err)
	}
	return string(b), nil
}
