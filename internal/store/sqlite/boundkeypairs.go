package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

const boundKeypairColumns = `token_id, initial_public_key, secret_ciphertext, secret_nonce, must_register_before,
	recovery_limit, recovery_mode, rotate_after, bound_public_key, bound_instance_id, recovery_count,
	recovery_sequence, last_recovered_at, last_rotated_at, epoch`

// insertBoundKeypair writes a bound-keypair token's row, in the
// transaction that inserts the token.
func insertBoundKeypair(ctx context.Context, tx *writeTx, id string, b *store.BoundKeypair) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO bound_keypairs (`+boundKeypairColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		id, b.Spec.InitialPublicKey, nilIfEmpty(b.SecretCiphertext), nilIfEmpty(b.SecretNonce), timeArg(b.Spec.MustRegisterBefore),
		b.Spec.RecoveryLimit, b.Spec.RecoveryMode, timeArg(b.Spec.RotateAfter), b.BoundPublicKey, b.BoundInstanceID,
		b.RecoveryCount, b.RecoverySequence, timeArg(b.LastRecoveredAt), timeArg(b.LastRotatedAt), b.Epoch)
	return err
}

func nilIfEmpty(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

func scanBoundKeypair(row scanner) (string, *store.BoundKeypair, error) {
	b, err := readRow(row, boundKeypairColumnCount)
	if err != nil {
		return "", nil, err
	}
	defer b.put()
	return boundKeypairFrom(b.cols(boundKeypairColumnCount))
}

var boundKeypairColumnCount = columnCount(boundKeypairColumns)

// boundKeypairFrom decodes boundKeypairColumns (see cols): the token's ID
// and its row.
func boundKeypairFrom(c cols) (string, *store.BoundKeypair, error) {
	id := c.str()
	b := store.BoundKeypair{Spec: store.BoundKeypairSpec{InitialPublicKey: c.str()}, SecretCiphertext: c.bytes(),
		SecretNonce: c.bytes()}
	b.Spec.MustRegisterBefore, b.Spec.RecoveryLimit, b.Spec.RecoveryMode, b.Spec.RotateAfter = c.time(), c.int(), c.str(), c.time()
	b.BoundPublicKey, b.BoundInstanceID, b.RecoveryCount, b.RecoverySequence = c.str(), c.str(), c.int(), c.int()
	b.LastRecoveredAt, b.LastRotatedAt, b.Epoch = c.time(), c.time(), c.str()
	if err := c.done(); err != nil {
		return "", nil, err
	}
	return id, &b, nil
}

// withBoundKeypairs attaches their rows to the bound-keypair tokens of ts,
// read by their IDs.
func withBoundKeypairs(ctx context.Context, q querier, ts []store.Token) error {
	var ids []string
	for _, t := range ts {
		if t.JoinMethod == store.JoinMethodBoundKeypair {
			ids = append(ids, t.ID)
		}
	}
	byID, err := boundKeypairsOf(ctx, q, ids)
	if err != nil {
		return err
	}
	for i := range ts {
		if ts[i].JoinMethod == store.JoinMethodBoundKeypair {
			ts[i].BoundKeypair = byID[ts[i].ID]
		}
	}
	return nil
}

// boundKeypairsByID reads the bound-keypair rows of a JSON list of token
// IDs through the primary key: a page of tokens reads its own rows, not
// the table. The CROSS JOIN fixes the order (SQLite keeps a CROSS JOIN's
// left table outside): with statistics (after an ANALYZE) and "token_id IN
// (SELECT value FROM json_each(?))", the planner, which cannot tell how
// many IDs the list holds, scanned the whole table through a Bloom filter
// (TestTokenPageReadsOnlyItsBoundKeypairRows holds the plan).
const boundKeypairsByID = `SELECT ` + boundKeypairColumns + ` FROM json_each(?) AS page
	CROSS JOIN bound_keypairs ON bound_keypairs.token_id = page.value`

// boundKeypairByID reads one token's bound-keypair row.
const boundKeypairByID = `SELECT ` + boundKeypairColumns + ` FROM bound_keypairs WHERE token_id = ?`

// boundKeypairsOf reads the bound-keypair rows of the tokens ids, by token
// ID: none, and no query, for no IDs.
func boundKeypairsOf(ctx context.Context, q querier, ids []string) (map[string]*store.BoundKeypair, error) {
	byID := map[string]*store.BoundKeypair{}
	if len(ids) == 0 {
		return byID, nil
	}
	// One ID — a bound-keypair join's read — is a look-up by key, with no
	// list to encode.
	query, arg := boundKeypairByID, ids[0]
	if len(ids) > 1 {
		list, err := json.Marshal(ids)
		if err != nil {
			return nil, err
		}
		query, arg = boundKeypairsByID, string(list)
	}
	rows, err := q.QueryContext(ctx, query, arg)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		id, b, err := scanBoundKeypair(rows)
		if err != nil {
			return nil, err
		}
		byID[id] = b
	}
	return byID, rows.Err()
}

// querier is what reads need of the reader pool or a write transaction.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// UpdateBoundKeypairSpec replaces the spec of a bound-keypair token in one
// write and returns the token as it now stands; ErrNotFound if there is no
// bound-keypair token with that ID. The status columns are not written.
func (s *SQLite) UpdateBoundKeypairSpec(ctx context.Context, id string, spec store.BoundKeypairSpec, svidUsage string) (store.Token, error) {
	var t store.Token
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `UPDATE bound_keypairs
			SET initial_public_key = ?, must_register_before = ?, recovery_limit = ?, recovery_mode = ?, rotate_after = ?
			WHERE token_id = ?`,
			spec.InitialPublicKey, timeArg(spec.MustRegisterBefore), spec.RecoveryLimit, spec.RecoveryMode,
			timeArg(spec.RotateAfter), id)
		if err != nil {
			return wrap("update bound keypair", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return wrap("update bound keypair", err)
		} else if n == 0 {
			return fmt.Errorf("sqlite: update bound keypair %s: %w", id, store.ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE tokens SET svid_usage = ? WHERE id = ?`,
			store.Token{SVIDUsage: svidUsage}.SVIDUsageOrDefault(), id); err != nil {
			return wrap("update bound keypair", err)
		}
		if t, err = scanToken(tx.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE id = ?`, id)); err != nil {
			return wrap("update bound keypair", err)
		}
		ts := []store.Token{t}
		if err := withBoundKeypairs(ctx, tx, ts); err != nil {
			return wrap("update bound keypair", err)
		}
		t = ts[0]
		return nil
	})
	return t, err
}

// bindKey is the KeyBinding claim: one conditional UPDATE on the token's
// row, which the single writer serializes against every other claim.
func bindKey(ctx context.Context, tx *writeTx, instanceID string, c store.KeyBinding) error {
	q := `UPDATE bound_keypairs SET bound_public_key = ?`
	args := []any{c.PublicKey}
	if instanceID != "" {
		q += `, bound_instance_id = ?`
		args = append(args, instanceID)
	}
	if c.UseRegistrationSecret || c.DropRegistrationSecret {
		q += `, secret_ciphertext = NULL, secret_nonce = NULL`
	}
	if c.Rotate {
		q += `, last_rotated_at = ` + nowMicros
	}
	q += ` WHERE token_id = ? AND bound_public_key = ?`
	args = append(args, c.TokenID, c.Expected)
	if c.UseRegistrationSecret {
		q += ` AND secret_ciphertext IS NOT NULL AND (must_register_before IS NULL OR must_register_before > ` + nowMicros + `)`
	}
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return wrap("bind key", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return wrap("bind key", err)
	} else if n > 0 {
		return nil
	}
	// Say which condition failed.
	var bound string
	err = tx.QueryRowContext(ctx, `SELECT bound_public_key FROM bound_keypairs WHERE token_id = ?`, c.TokenID).Scan(&bound)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("sqlite: bind key: token %s: %w", c.TokenID, store.ErrNotFound)
	case err != nil:
		return wrap("bind key", err)
	case bound != c.Expected:
		return fmt.Errorf("sqlite: bind key: token %s: %w", c.TokenID, store.ErrKeyBindingChanged)
	default:
		return fmt.Errorf("sqlite: bind key: token %s: %w", c.TokenID, store.ErrRegistrationClosed)
	}
}

// recoverToken is the Recovery claim: one conditional UPDATE on the
// token's row, which the single writer serializes against every other
// claim. A resync holds only while its epoch's window is open.
func recoverToken(ctx context.Context, tx *writeTx, instanceID string, c store.Recovery) error {
	counted, resync := 0, 0
	if c.Counted {
		counted = 1
	}
	if c.Resync {
		resync = 1
	}
	res, err := tx.ExecContext(ctx, `UPDATE bound_keypairs
		SET recovery_sequence = ?, recovery_count = recovery_count + ?, epoch = ?,
			bound_instance_id = ?, last_recovered_at = `+nowMicros+`
		WHERE token_id = ? AND recovery_sequence = ? AND epoch = ? AND (? = 0 OR recovery_count < recovery_limit)
			AND (? = 0 OR EXISTS (SELECT 1 FROM bound_keypair_epochs
				WHERE id = ? AND closed_at IS NULL AND open_until > `+nowMicros+`))`,
		c.NewSequence(), counted, c.Epoch, instanceID, c.TokenID, c.ExpectedSequence, c.ExpectedEpoch, counted,
		resync, c.Epoch)
	if err != nil {
		return wrap("recover", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return wrap("recover", err)
	} else if n > 0 {
		return nil
	}
	var (
		seq   int64
		epoch string
	)
	err = tx.QueryRowContext(ctx, `SELECT recovery_sequence, epoch FROM bound_keypairs WHERE token_id = ?`, c.TokenID).Scan(&seq, &epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlite: recover: token %s: %w", c.TokenID, store.ErrNotFound)
	} else if err != nil {
		return wrap("recover", err)
	}
	return store.RecoveryFailed("sqlite", c, seq, epoch)
}

// InsertJoinStateKey adds a join-state key; ErrConflict if its ID exists.
func (s *SQLite) InsertJoinStateKey(ctx context.Context, k store.JoinStateKey) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO join_state_keys (id, public_key, ciphertext, nonce, created_at)
		VALUES (?, ?, ?, ?, ?)`, k.ID, k.PublicKey, k.Ciphertext, k.Nonce, timeArg(k.CreatedAt))
	if err != nil {
		return wrap("insert join-state key", err)
	}
	return nil
}

// ListJoinStateKeys returns every join-state key, newest first.
func (s *SQLite) ListJoinStateKeys(ctx context.Context) ([]store.JoinStateKey, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, public_key, ciphertext, nonce, created_at FROM join_state_keys
		ORDER BY created_at DESC, id`)
	if err != nil {
		return nil, wrap("list join-state keys", err)
	}
	return collect(rows, "list join-state keys", func(r scanner) (store.JoinStateKey, error) {
		var (
			k       store.JoinStateKey
			created sql.NullInt64
		)
		err := r.Scan(&k.ID, &k.PublicKey, &k.Ciphertext, &k.Nonce, &created)
		k.CreatedAt = timeCol(created)
		return k, err
	})
}

// CarryJoinState writes a bound-keypair token's join state and the
// join-state keys the store kept aside holds, with their record, in one
// transaction (see store.JoinStateCarrier).
func (s *SQLite) CarryJoinState(ctx context.Context, c store.CarriedJoinState, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "carry join state of token " + c.TokenID
	if c.TokenID == "" {
		op = "carry join-state keys"
	}
	if audit == nil {
		return fmt.Errorf("sqlite: %s: no audit record: join state is never carried unaudited", op)
	}
	if err := c.Check(); err != nil {
		return fmt.Errorf("sqlite: %s: %w", op, err)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		changed := false
		if c.TokenID != "" {
			h, n := c.Held, c.State
			dropSecret := 0
			if len(n.SecretCiphertext) == 0 {
				dropSecret = 1
			}
			res, err := tx.ExecContext(ctx, `UPDATE bound_keypairs
				SET bound_public_key = ?1, bound_instance_id = ?2, recovery_count = ?3, recovery_sequence = ?4, epoch = ?5,
					last_recovered_at = ?6, last_rotated_at = ?7,
					secret_ciphertext = CASE WHEN ?8 THEN NULL ELSE secret_ciphertext END,
					secret_nonce = CASE WHEN ?8 THEN NULL ELSE secret_nonce END
				WHERE token_id = ?9 AND bound_public_key = ?10 AND bound_instance_id = ?11 AND recovery_count = ?12
					AND recovery_sequence = ?13 AND epoch = ?14 AND last_rotated_at IS ?15
					AND (?5 = epoch OR EXISTS (SELECT 1 FROM bound_keypair_epochs n WHERE n.id = ?5
						AND n.ordinal > COALESCE((SELECT o.ordinal FROM bound_keypair_epochs o WHERE o.id = bound_keypairs.epoch), 0)))`,
				n.BoundPublicKey, n.BoundInstanceID, n.RecoveryCount, n.RecoverySequence, n.Epoch,
				timeArg(n.LastRecoveredAt), timeArg(n.LastRotatedAt), dropSecret,
				c.TokenID, h.BoundPublicKey, h.BoundInstanceID, h.RecoveryCount, h.RecoverySequence, h.Epoch, timeArg(h.LastRotatedAt))
			if err != nil {
				return wrap(op, err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return wrap(op, err)
			} else if n == 0 {
				var seq int64
				var epoch, key string
				err := tx.QueryRowContext(ctx, `SELECT recovery_sequence, epoch, bound_public_key FROM bound_keypairs WHERE token_id = ?`, c.TokenID).Scan(&seq, &epoch, &key)
				if errors.Is(err, sql.ErrNoRows) {
					return fmt.Errorf("sqlite: %s: %w", op, store.ErrNotFound)
				} else if err != nil {
					return wrap(op, err)
				}
				return fmt.Errorf("sqlite: %s: %w: it binds %s at recovery sequence %d of epoch %q, not as read, or epoch %q is not a later one it knows",
					op, store.ErrConflict, key, seq, epoch, c.State.Epoch)
			}
			changed = true
		}
		for _, k := range c.Keys {
			res, err := tx.ExecContext(ctx, `INSERT INTO join_state_keys (id, public_key, ciphertext, nonce, created_at)
				VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`, k.ID, k.PublicKey, k.Ciphertext, k.Nonce, timeArg(k.CreatedAt))
			if err != nil {
				return wrap(op+": join-state key "+k.ID, err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return wrap(op, err)
			} else if n > 0 {
				changed = true
			}
		}
		if !changed {
			return fmt.Errorf("sqlite: %s: %w: the store holds every key already", op, store.ErrConflict)
		}
		return appendAuditOf(ctx, tx, op, audit)
	})
}
