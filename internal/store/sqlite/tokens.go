package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

const tokenColumns = `id, join_method, ciphertext, nonce, uses_allowed, uses_count, expires_at,
	node_id, description, labels, created_by, created_at, last_used_at, svid_usage`

// InsertToken adds a token; ErrConflict if its ID exists. UsesCount and
// LastUsedAt are stored as given, so a token can be carried over from
// another store.
func (s *SQLite) InsertToken(ctx context.Context, t store.Token, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: insert token %s: no audit record: a token is never created unaudited", t.ID)
	}
	labels, err := labelsArg(t.Labels)
	if err != nil {
		return fmt.Errorf("sqlite: insert token: %w", err)
	}
	if t.BoundKeypair != nil && t.JoinMethod != store.JoinMethodBoundKeypair {
		return fmt.Errorf("sqlite: insert token %s: only a bound-keypair token has BoundKeypair", t.ID)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tokens (`+tokenColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			t.ID, t.JoinMethod, t.Ciphertext, t.Nonce, t.UsesAllowed, t.UsesCount, timeArg(t.ExpiresAt),
			t.NodeID, t.Description, labels, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.LastUsedAt), t.SVIDUsageOrDefault())
		if err != nil {
			return wrap("insert token", err)
		}
		if t.BoundKeypair != nil {
			if err := insertBoundKeypair(ctx, tx, t.ID, t.BoundKeypair); err != nil {
				return wrap("insert token", err)
			}
		}
		return appendAuditOf(ctx, tx, "insert token "+t.ID, audit)
	})
}

// GetToken returns a token, expired or not; ErrNotFound if there is none
// with that ID. It is the admin API's read: a join reads its token with
// ReadJoin, whose decoy row keeps an unknown ID from answering sooner.
func (s *SQLite) GetToken(ctx context.Context, id string) (store.Token, error) {
	t, err := scanToken(s.r.lookup(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE id = ?`, id))
	if err != nil {
		return store.Token{}, wrap("get token "+id, err)
	}
	ts := []store.Token{t}
	if err := withBoundKeypairs(ctx, s.r, ts); err != nil {
		return store.Token{}, wrap("get token "+id, err)
	}
	return ts[0], nil
}

// ListTokens returns every token, expired or not, oldest first (ties by
// ID): ListTokensPage's order, in one page.
func (s *SQLite) ListTokens(ctx context.Context) ([]store.Token, error) {
	return s.ListTokensPage(ctx, store.TokenKey{}, math.MaxInt)
}

// DeleteToken removes a token; ErrNotFound if there is none with that ID.
// Nodes, instances and certificates name the token by ID only, so they are
// left as they are.
func (s *SQLite) DeleteToken(ctx context.Context, id string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: delete token %s: no audit record: a token is never deleted unaudited", id)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM tokens WHERE id = ?`, id)
		if err != nil {
			return wrap("delete token", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("delete token", err)
		}
		if n == 0 {
			return wrap("delete token "+id, sql.ErrNoRows)
		}
		return appendAuditOf(ctx, tx, "delete token "+id, audit)
	})
}

// RaiseTokenUses sets a token's use count to uses, at most its allowed
// uses, where that raises it; the read that tells a token gone from one
// counting the uses already is in the same transaction.
func (s *SQLite) RaiseTokenUses(ctx context.Context, id string, uses int64, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "raise token uses " + id
	if audit == nil {
		return fmt.Errorf("sqlite: %s: no audit record: a token's uses are never changed unaudited", op)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `UPDATE tokens SET uses_count = min(?, uses_allowed)
			WHERE id = ? AND uses_allowed > 0 AND uses_count < min(?, uses_allowed)`, uses, id, uses)
		if err != nil {
			return wrap(op, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap(op, err)
		}
		if n == 0 {
			var one int
			if err := tx.QueryRowContext(ctx, `SELECT 1 FROM tokens WHERE id = ?`, id).Scan(&one); err != nil {
				return wrap(op, err)
			}
			return fmt.Errorf("sqlite: %s: %w: it has unlimited uses or counts %d already", op, store.ErrConflict, uses)
		}
		return appendAuditOf(ctx, tx, op, audit)
	})
}

// DeleteExpiredTokens removes the tokens whose expiry is at least retention
// before the store clock and returns their IDs in ascending order. A
// negative retention counts as zero, so no token still in force is ever
// removed. Bound-keypair tokens are left alone: an agent holding one
// recovers through it, and only an operator removes it.
func (s *SQLite) DeleteExpiredTokens(ctx context.Context, retention time.Duration, audit func(ids []string) func(store.AuditHead) (store.AuditRecord, error)) ([]string, error) {
	if audit == nil {
		return nil, fmt.Errorf("sqlite: delete expired tokens: no audit record: a token is never deleted unaudited")
	}
	return s.sweepAudited(ctx, "delete expired tokens", `DELETE FROM tokens
		WHERE expires_at IS NOT NULL AND expires_at <= `+nowMicros+` - ? AND join_method <> 'bound-keypair'
		RETURNING id`, []any{max(retention, 0).Microseconds()},
		audit, "a token is never deleted unaudited")
}

func scanToken(row scanner) (store.Token, error) {
	b, err := readRow(row, tokenColumnCount)
	if err != nil {
		return store.Token{}, err
	}
	defer b.put()
	return tokenFrom(b.cols(tokenColumnCount))
}

var tokenColumnCount = columnCount(tokenColumns)

// tokenFrom decodes tokenColumns (see cols).
func tokenFrom(c cols) (store.Token, error) {
	t := store.Token{ID: c.str(), JoinMethod: c.str(), Ciphertext: c.bytes(), Nonce: c.bytes(),
		UsesAllowed: c.int(), UsesCount: c.int(), ExpiresAt: c.time(), NodeID: c.str(), Description: c.str()}
	labels := c.str()
	t.CreatedBy, t.CreatedAt, t.LastUsedAt, t.SVIDUsage = c.str(), c.time(), c.time(), c.str()
	if err := c.done(); err != nil {
		return store.Token{}, err
	}
	// No labels are stored as "{}" (labelsArg), which reads as nil
	// without the JSON decoder a join would otherwise run on every token.
	if labels != "{}" {
		var err error
		if t.Labels, err = labelsCol(labels); err != nil {
			return store.Token{}, fmt.Errorf("token %s: labels: %w", t.ID, err)
		}
	}
	if t.SVIDUsage == store.SVIDUsageClient {
		t.SVIDUsage = "" // the default reads as unset
	}
	return t, nil
}

// labelsCol decodes a labels column; an empty object is nil. A function
// of its own so that the map's holder json.Unmarshal is handed goes to
// the heap only when there are labels.
func labelsCol(s string) (map[string]string, error) {
	var labels map[string]string
	if err := json.Unmarshal([]byte(s), &labels); err != nil {
		return nil, err
	}
	if len(labels) == 0 {
		return nil, nil
	}
	return labels, nil
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
