package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

const boundKeypairColumns = `token_id, initial_public_key, secret_ciphertext, secret_nonce, must_register_before,
	recovery_limit, recovery_mode, rotate_after, bound_public_key, bound_instance_id, recovery_count,
	recovery_sequence, last_recovered_at, last_rotated_at, epoch`

// queueBoundKeypair queues a bound-keypair token's row, in the pipe
// that inserts the token.
func queueBoundKeypair(p *pipe, id string, b *store.BoundKeypair) {
	p.exec(`INSERT INTO bound_keypairs (`+boundKeypairColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
		[]any{id, b.Spec.InitialPublicKey, nilIfEmpty(b.SecretCiphertext), nilIfEmpty(b.SecretNonce), timeArg(b.Spec.MustRegisterBefore),
			b.Spec.RecoveryLimit, b.Spec.RecoveryMode, timeArg(b.Spec.RotateAfter), b.BoundPublicKey, b.BoundInstanceID,
			b.RecoveryCount, b.RecoverySequence, timeArg(b.LastRecoveredAt), timeArg(b.LastRotatedAt), b.Epoch},
		wrapped("insert token: bound keypair"))
}

func nilIfEmpty(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

func scanBoundKeypair(row pgx.Row) (string, *store.BoundKeypair, error) {
	var (
		id                                   string
		b                                    store.BoundKeypair
		before, rotate, recovered, rotatedAt *int64
	)
	if err := row.Scan(&id, &b.Spec.InitialPublicKey, &b.SecretCiphertext, &b.SecretNonce, &before,
		&b.Spec.RecoveryLimit, &b.Spec.RecoveryMode, &rotate, &b.BoundPublicKey, &b.BoundInstanceID, &b.RecoveryCount,
		&b.RecoverySequence, &recovered, &rotatedAt, &b.Epoch); err != nil {
		return "", nil, err
	}
	b.Spec.MustRegisterBefore, b.Spec.RotateAfter = timeCol(before), timeCol(rotate)
	b.LastRecoveredAt, b.LastRotatedAt = timeCol(recovered), timeCol(rotatedAt)
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

// boundKeypairsOf reads the bound-keypair rows of the tokens ids, by token
// ID: none, and no query, for no IDs.
func boundKeypairsOf(ctx context.Context, q querier, ids []string) (map[string]*store.BoundKeypair, error) {
	byID := map[string]*store.BoundKeypair{}
	if len(ids) == 0 {
		return byID, nil
	}
	rows, err := q.Query(ctx, `SELECT `+boundKeypairColumns+` FROM bound_keypairs WHERE token_id = ANY($1)`, ids)
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

// UpdateBoundKeypairSpec replaces the spec of a bound-keypair token in one
// write and returns the token as it now stands; ErrNotFound if there is no
// bound-keypair token with that ID. The status columns are not written.
func (s *Store) UpdateBoundKeypairSpec(ctx context.Context, id string, spec store.BoundKeypairSpec, svidUsage string) (store.Token, error) {
	var t store.Token
	err := s.inTx(ctx, "update bound keypair", func(tx pgx.Tx) error {
		res, err := tx.Exec(ctx, `UPDATE bound_keypairs
			SET initial_public_key = $1, must_register_before = $2, recovery_limit = $3, recovery_mode = $4, rotate_after = $5
			WHERE token_id = $6`,
			spec.InitialPublicKey, timeArg(spec.MustRegisterBefore), spec.RecoveryLimit, spec.RecoveryMode,
			timeArg(spec.RotateAfter), id)
		if err != nil {
			return wrap("update bound keypair", err)
		}
		if res.RowsAffected() == 0 {
			return fmt.Errorf("postgres: update bound keypair %s: %w", id, store.ErrNotFound)
		}
		if _, err := tx.Exec(ctx, `UPDATE tokens SET svid_usage = $1 WHERE id = $2`,
			store.Token{SVIDUsage: svidUsage}.SVIDUsageOrDefault(), id); err != nil {
			return wrap("update bound keypair", err)
		}
		if t, err = scanToken(tx.QueryRow(ctx, `SELECT `+tokenReadColumns+` FROM tokens WHERE id = $1`, id)); err != nil {
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
// bound-keypair row. Concurrent claims on one token queue on its row
// lock, and PostgreSQL re-evaluates the WHERE clause against the row the
// winner committed, so exactly one binding from one expected key
// succeeds. A failed binding says which condition failed from the row as
// committed after the rollback (lostWrite).
func bindKey(instanceID string, c store.KeyBinding) statement {
	args := []any{c.PublicKey, c.TokenID, c.Expected}
	q := `UPDATE bound_keypairs SET bound_public_key = $1`
	if instanceID != "" {
		args = append(args, instanceID)
		q += fmt.Sprintf(`, bound_instance_id = $%d`, len(args))
	}
	if c.UseRegistrationSecret || c.DropRegistrationSecret {
		q += `, secret_ciphertext = NULL, secret_nonce = NULL`
	}
	if c.Rotate {
		q += `, last_rotated_at = ` + nowMicros
	}
	q += ` WHERE token_id = $2 AND bound_public_key = $3`
	if c.UseRegistrationSecret {
		q += ` AND secret_ciphertext IS NOT NULL AND (must_register_before IS NULL OR must_register_before > ` + nowMicros + `)`
	}
	q += ` RETURNING true`
	return statement{sql: q, args: args, read: func(row pgx.Row) error {
		var bound bool
		switch err := row.Scan(&bound); {
		case errors.Is(err, pgx.ErrNoRows):
			return keyNotBound(c)
		case err != nil:
			return wrap("bind key", err)
		}
		return nil
	}}
}

// keyNotBound says why a key binding failed, from the row as committed
// after the rollback: ErrNotFound, ErrKeyBindingChanged, or
// ErrRegistrationClosed when the key was the one expected.
func keyNotBound(c store.KeyBinding) *lostWrite {
	return &lostWrite{why: statement{
		sql:  `SELECT bound_public_key FROM bound_keypairs WHERE token_id = $1`,
		args: []any{c.TokenID},
		read: func(row pgx.Row) error {
			var bound string
			switch err := row.Scan(&bound); {
			case errors.Is(err, pgx.ErrNoRows):
				return fmt.Errorf("postgres: bind key: token %s: %w", c.TokenID, store.ErrNotFound)
			case err != nil:
				return wrap("bind key", err)
			case bound != c.Expected:
				return fmt.Errorf("postgres: bind key: token %s: %w", c.TokenID, store.ErrKeyBindingChanged)
			}
			return fmt.Errorf("postgres: bind key: token %s: %w", c.TokenID, store.ErrRegistrationClosed)
		},
	}}
}

// recoverToken is the Recovery claim: one conditional UPDATE on the
// token's bound-keypair row; concurrent recoveries queue on its row lock
// and only the first finds the sequence and epoch it expected. A resync
// holds only while its epoch's window is open by the database clock. A
// failed recovery says why from the row as committed after the rollback
// (lostWrite).
func recoverToken(instanceID string, c store.Recovery) statement {
	counted := 0
	if c.Counted {
		counted = 1
	}
	return statement{
		sql: `UPDATE bound_keypairs
			SET recovery_sequence = $1, recovery_count = recovery_count + $2, epoch = $3,
				bound_instance_id = $4, last_recovered_at = ` + nowMicros + `
			WHERE token_id = $5 AND recovery_sequence = $6 AND epoch = $7 AND ($2 = 0 OR recovery_count < recovery_limit)
				AND (NOT $8 OR EXISTS (SELECT 1 FROM bound_keypair_epochs
					WHERE id = $3 AND closed_at IS NULL AND open_until > ` + nowMicros + `))
			RETURNING true`,
		args: []any{c.NewSequence(), counted, c.Epoch, instanceID, c.TokenID, c.ExpectedSequence, c.ExpectedEpoch, c.Resync},
		read: func(row pgx.Row) error {
			var recovered bool
			switch err := row.Scan(&recovered); {
			case errors.Is(err, pgx.ErrNoRows):
				return notRecovered(c)
			case err != nil:
				return wrap("recover", err)
			}
			return nil
		},
	}
}

// notRecovered says why a recovery failed, from the row as committed after
// the rollback (store.RecoveryFailed), or ErrNotFound.
func notRecovered(c store.Recovery) *lostWrite {
	return &lostWrite{why: statement{
		sql:  `SELECT recovery_sequence, epoch FROM bound_keypairs WHERE token_id = $1`,
		args: []any{c.TokenID},
		read: func(row pgx.Row) error {
			var (
				seq   int64
				epoch string
			)
			switch err := row.Scan(&seq, &epoch); {
			case errors.Is(err, pgx.ErrNoRows):
				return fmt.Errorf("postgres: recover: token %s: %w", c.TokenID, store.ErrNotFound)
			case err != nil:
				return wrap("recover", err)
			}
			return store.RecoveryFailed("postgres", c, seq, epoch)
		},
	}}
}

// InsertJoinStateKey adds a join-state key; ErrConflict if its ID exists.
func (s *Store) InsertJoinStateKey(ctx context.Context, k store.JoinStateKey) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO join_state_keys (id, public_key, ciphertext, nonce, created_at)
		VALUES ($1, $2, $3, $4, $5)`, k.ID, k.PublicKey, k.Ciphertext, k.Nonce, timeArg(k.CreatedAt))
	if err != nil {
		return wrap("insert join-state key", err)
	}
	return nil
}

// ListJoinStateKeys returns every join-state key, newest first.
func (s *Store) ListJoinStateKeys(ctx context.Context) ([]store.JoinStateKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, public_key, ciphertext, nonce, created_at FROM join_state_keys
		ORDER BY created_at DESC, id`)
	if err != nil {
		return nil, wrap("list join-state keys", err)
	}
	return collect(rows, "list join-state keys", func(r pgx.Row) (store.JoinStateKey, error) {
		var (
			k       store.JoinStateKey
			created *int64
		)
		err := r.Scan(&k.ID, &k.PublicKey, &k.Ciphertext, &k.Nonce, &created)
		k.CreatedAt = timeCol(created)
		return k, err
	})
}

// CarryJoinState writes a bound-keypair token's join state and the
// join-state keys the store kept aside holds, with their record, in one
// transaction (see store.JoinStateCarrier).
func (s *Store) CarryJoinState(ctx context.Context, c store.CarriedJoinState, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "carry join state of token " + c.TokenID
	if c.TokenID == "" {
		op = "carry join-state keys"
	}
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: join state is never carried unaudited", op)
	}
	if err := c.Check(); err != nil {
		return fmt.Errorf("postgres: %s: %w", op, err)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		changed := false
		if c.TokenID != "" {
			h, n := c.Held, c.State
			p.row(`WITH was AS (SELECT recovery_sequence, epoch, bound_public_key FROM bound_keypairs WHERE token_id = $9),
					moved AS (UPDATE bound_keypairs
						SET bound_public_key = $1, bound_instance_id = $2, recovery_count = $3, recovery_sequence = $4, epoch = $5,
							last_recovered_at = $6, last_rotated_at = $7,
							secret_ciphertext = CASE WHEN $8 THEN NULL ELSE secret_ciphertext END,
							secret_nonce = CASE WHEN $8 THEN NULL ELSE secret_nonce END
						WHERE token_id = $9 AND bound_public_key = $10 AND bound_instance_id = $11 AND recovery_count = $12
							AND recovery_sequence = $13 AND epoch = $14 AND last_rotated_at IS NOT DISTINCT FROM $15
							AND ($5 = epoch OR EXISTS (SELECT 1 FROM bound_keypair_epochs n WHERE n.id = $5
								AND n.ordinal > COALESCE((SELECT o.ordinal FROM bound_keypair_epochs o WHERE o.id = bound_keypairs.epoch), 0)))
						RETURNING 1)
				SELECT (SELECT recovery_sequence FROM was), (SELECT epoch FROM was), (SELECT bound_public_key FROM was), EXISTS (SELECT 1 FROM moved)`,
				[]any{n.BoundPublicKey, n.BoundInstanceID, n.RecoveryCount, n.RecoverySequence, n.Epoch,
					timeArg(n.LastRecoveredAt), timeArg(n.LastRotatedAt), len(n.SecretCiphertext) == 0,
					c.TokenID, h.BoundPublicKey, h.BoundInstanceID, h.RecoveryCount, h.RecoverySequence, h.Epoch, timeArg(h.LastRotatedAt)},
				func(row pgx.Row) error {
					var seq *int64
					var epoch, key *string
					var moved bool
					if err := row.Scan(&seq, &epoch, &key, &moved); err != nil {
						return wrap(op, err)
					}
					switch {
					case moved:
						changed = true
						return nil
					case seq == nil:
						return fmt.Errorf("postgres: %s: %w", op, store.ErrNotFound)
					}
					return fmt.Errorf("postgres: %s: %w: it binds %s at recovery sequence %d of epoch %q, not as read, or epoch %q is not a later one it knows",
						op, store.ErrConflict, *key, *seq, *epoch, c.State.Epoch)
				})
		}
		for _, k := range c.Keys {
			p.exec(`INSERT INTO join_state_keys (id, public_key, ciphertext, nonce, created_at)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`, []any{k.ID, k.PublicKey, k.Ciphertext, k.Nonce, timeArg(k.CreatedAt)},
				func(tag pgconn.CommandTag, err error) error {
					if err != nil {
						return wrap(op+": join-state key "+k.ID, err)
					}
					if tag.RowsAffected() > 0 {
						changed = true
					}
					return nil
				})
		}
		if err := p.send(ctx); err != nil {
			return err
		}
		if !changed {
			return fmt.Errorf("postgres: %s: %w: the store holds every key already", op, store.ErrConflict)
		}
		return commitAudited(ctx, p, audit, op)
	})
}
