package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

const signerColumns = `version_id, public_key, key_ref, state, published_at, effective_at, grace_until, retires_at, ended_at, previous`

// ListSigners returns every signer, oldest published first, and the
// verifier set version, read in one REPEATABLE READ snapshot so the
// version matches the rows.
func (s *Store) ListSigners(ctx context.Context) ([]store.Signer, store.SignerSetID, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, store.SignerSetID{}, wrap("list signers: begin", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var id store.SignerSetID
	if err := tx.QueryRow(ctx, `SELECT version, stepped_at FROM signer_set WHERE id = 1`).Scan(&id.Version, &id.SteppedAt); err != nil {
		return nil, id, wrap("list signers: version", err)
	}
	rows, err := tx.Query(ctx, `SELECT `+signerColumns+` FROM signers ORDER BY published_at, version_id`)
	if err != nil {
		return nil, store.SignerSetID{}, wrap("list signers", err)
	}
	out, err := collect(rows, "list signers", scanSigner)
	if err != nil {
		return nil, store.SignerSetID{}, err
	}
	return out, id, nil
}

// SignerSetID returns the verifier set's ID (see store.SignerStore): one
// round trip.
func (s *Store) SignerSetID(ctx context.Context) (store.SignerSetID, error) {
	var id store.SignerSetID
	if err := s.pool.QueryRow(ctx, `SELECT version, stepped_at FROM signer_set WHERE id = 1`).Scan(&id.Version, &id.SteppedAt); err != nil {
		return id, wrap("signer set id", err)
	}
	return id, nil
}

// ApplySignerChanges writes a lifecycle step (see store.SignerStore) in one
// READ COMMITTED transaction with its audit record: one pipe, the step
// and the link's baton in the first batch, the record with COMMIT in the
// second (as InsertLock). Its first statement advances the one
// signer_set row only from the expected set ID (version and step time): a
// concurrent step waits on that row and, once the first commits, re-reads
// it, finds it moved and conflicts; so does a step planned before a
// restore once the store is stepped back up to its version. Each update is conditional on the row's state, and
// the partial unique index keeps one signer per live state.
func (s *Store) ApplySignerChanges(ctx context.Context, expect store.SignerSetID, changes []store.SignerChange, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	if audit == nil {
		return 0, fmt.Errorf("postgres: apply signer changes: no audit record: a signer step is never taken unaudited")
	}
	if expect.Version+1 >= store.MaxSignerSetVersion {
		return 0, fmt.Errorf("postgres: apply signer changes: version %d: %w", expect.Version+1, store.ErrSetVersionExhausted)
	}
	for _, c := range changes {
		if err := c.CheckDropKey(); err != nil {
			return 0, fmt.Errorf("postgres: %w", err)
		}
	}
	const op = "apply signer changes"
	err := s.inPipe(ctx, op, func(p *pipe) error {
		queueStepSet(p, op, expect, expect.Version+1)
		for _, c := range changes {
			queueSignerChange(p, c)
		}
		// Every stream sends the new verifier set.
		queueNotify(p, store.ChangeSigners)
		return commitAudited(ctx, p, audit, op)
	})
	if err != nil {
		return 0, err
	}
	return expect.Version + 1, nil
}

// queueStepSet moves the verifier set from expect to version to, stamped
// with the store clock, only where the store's set ID is still expect,
// and drops the kept sets that are not of this store's sets up to expect:
// those above its version, and one at its version kept for another step
// time (or none known).
func queueStepSet(p *pipe, op string, expect store.SignerSetID, to int64) {
	p.exec(`UPDATE signer_set SET version = $1, stepped_at = `+nowMicros+` WHERE id = 1 AND version = $2 AND stepped_at = $3`,
		[]any{to, expect.Version, expect.SteppedAt},
		func(tag pgconn.CommandTag, err error) error {
			if err != nil {
				return wrap(op+": version", err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("postgres: %w", store.StepMoved(op, expect))
			}
			return nil
		})
	p.exec(`DELETE FROM verifier_sets WHERE version > $1 OR (version = $1 AND stepped_at IS DISTINCT FROM $2)`,
		[]any{expect.Version, expect.SteppedAt}, wrapped(op+": drop sets not of the version's step"))
}

func queueSignerChange(p *pipe, c store.SignerChange) {
	t := c.To
	if c.From == "" {
		p.exec(`INSERT INTO signers (`+signerColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			[]any{t.VersionID, t.PublicKey, t.KeyRef, t.State, timeArg(t.PublishedAt), timeArg(t.EffectiveAt),
				timeArg(t.GraceUntil), timeArg(t.RetiresAt), timeArg(t.EndedAt), t.Previous}, wrapped("insert signer "+t.VersionID))
		return
	}
	// Only the lifecycle fields change; the key reference only goes, with
	// the step that ends the signer (DropKey).
	p.exec(`UPDATE signers SET state = $1, effective_at = $2, grace_until = $3, retires_at = $4, ended_at = $5,
		key_ref = CASE WHEN $6 THEN ''::bytea ELSE key_ref END
		WHERE version_id = $7 AND state = $8`,
		[]any{t.State, timeArg(t.EffectiveAt), timeArg(t.GraceUntil), timeArg(t.RetiresAt), timeArg(t.EndedAt), c.DropKey, t.VersionID, c.From},
		func(tag pgconn.CommandTag, err error) error {
			if err != nil {
				return wrap("update signer "+t.VersionID, err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("postgres: update signer %s: not in state %s: %w", t.VersionID, c.From, store.ErrConflict)
			}
			return nil
		})
}

func scanSigner(row pgx.Row) (store.Signer, error) {
	var (
		sg                                    store.Signer
		published, eff, grace, retires, ended *int64
	)
	if err := row.Scan(&sg.VersionID, &sg.PublicKey, &sg.KeyRef, &sg.State, &published, &eff, &grace, &retires, &ended, &sg.Previous); err != nil {
		return store.Signer{}, err
	}
	sg.PublishedAt, sg.EffectiveAt, sg.GraceUntil, sg.RetiresAt, sg.EndedAt = timeCol(published), timeCol(eff), timeCol(grace), timeCol(retires), timeCol(ended)
	return sg, nil
}

// AdvanceSignerSet moves the verifier set version forward with no signer
// changed and keeps its signed set (see store.SignerStore): one
// conditional write, with its audit record in the same transaction.
func (s *Store) AdvanceSignerSet(ctx context.Context, expect store.SignerSetID, to int64, set []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: advance signer set: no audit record: the set is never advanced unaudited")
	}
	if len(set) == 0 {
		return fmt.Errorf("postgres: advance signer set to %d: no signed set: the version never moves without its set", to)
	}
	if to <= expect.Version {
		return fmt.Errorf("postgres: advance signer set: %d is not above %d: %w", to, expect.Version, store.ErrConflict)
	}
	if to >= store.MaxSignerSetVersion {
		return fmt.Errorf("postgres: advance signer set to %d: %w", to, store.ErrSetVersionExhausted)
	}
	const op = "advance signer set"
	return s.inPipe(ctx, op, func(p *pipe) error {
		queueStepSet(p, op, expect, to)
		p.exec(`INSERT INTO verifier_sets (version, raw, stepped_at) SELECT $1, $2, stepped_at FROM signer_set WHERE id = 1`,
			[]any{to, set}, wrapped(op+": keep its set"))
		queueNotify(p, store.ChangeSigners)
		return commitAudited(ctx, p, audit, op)
	})
}

// PutVerifierSet keeps the set signed from the rows read with id while
// the store's set ID is still id (see store.SignerStore): one statement
// that reads the signer_set row FOR SHARE and inserts from it. A step or
// an advance in flight holds that row: the read waits for it and, once it
// commits, gets the row it wrote, whose ID no longer matches; a step that
// comes after waits for this statement. So no set is kept for an ID that
// is not current when the statement ends. A set kept at the version for
// another step time is replaced.
func (s *Store) PutVerifierSet(ctx context.Context, id store.SignerSetID, raw []byte) error {
	if len(raw) == 0 {
		return fmt.Errorf("postgres: put verifier set %d: no signed set", id.Version)
	}
	var cur store.SignerSetID
	err := s.pool.QueryRow(ctx, `WITH cur AS (SELECT version, stepped_at FROM signer_set WHERE id = 1 FOR SHARE),
		kept AS (INSERT INTO verifier_sets AS v (version, raw, stepped_at)
			SELECT version, $3, stepped_at FROM cur WHERE version = $1 AND stepped_at = $2
			ON CONFLICT (version) DO UPDATE SET raw = excluded.raw, stepped_at = excluded.stepped_at
				WHERE v.stepped_at IS DISTINCT FROM excluded.stepped_at)
		SELECT version, stepped_at FROM cur`, id.Version, id.SteppedAt, raw).Scan(&cur.Version, &cur.SteppedAt)
	if err != nil {
		return wrap("put verifier set", err)
	}
	if cur != id {
		return fmt.Errorf("postgres: put verifier set: %w", store.SetMoved(id, cur))
	}
	return nil
}

// VerifierSets returns the kept sets above after, oldest first; the
// current version's only if kept for its step.
func (s *Store) VerifierSets(ctx context.Context, after int64, limit int) ([]store.PublishedSet, error) {
	rows, err := s.pool.Query(ctx, `SELECT v.version, v.raw FROM verifier_sets v, signer_set c
		WHERE c.id = 1 AND v.version > $1 AND (v.version < c.version OR (v.version = c.version AND v.stepped_at = c.stepped_at))
		ORDER BY v.version LIMIT $2`, after, limit)
	if err != nil {
		return nil, wrap("verifier sets", err)
	}
	defer rows.Close()
	var out []store.PublishedSet
	for rows.Next() {
		var p store.PublishedSet
		if err := rows.Scan(&p.Version, &p.Raw); err != nil {
			return nil, wrap("verifier sets", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("verifier sets", err)
	}
	return out, nil
}

// DropSignerKey empties an ended signer's key reference (see
// store.SignerStore): one conditional write, with its audit record in the
// same transaction; a concurrent one waits on the row and then finds the
// reference gone.
func (s *Store) DropSignerKey(ctx context.Context, versionID string, ref []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: drop signer key %s: no audit record: a key is never destroyed unaudited", versionID)
	}
	if len(ref) == 0 {
		return fmt.Errorf("postgres: drop signer key %s: no reference given: %w", versionID, store.ErrConflict)
	}
	op := "drop signer key " + versionID
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`UPDATE signers SET key_ref = ''::bytea
			WHERE version_id = $1 AND state IN ('retired', 'revoked') AND key_ref = $2`, []any{versionID, ref},
			func(tag pgconn.CommandTag, err error) error {
				if err != nil {
					return wrap(op, err)
				}
				if tag.RowsAffected() != 1 {
					return fmt.Errorf("postgres: drop signer key %s: not an ended signer holding that reference: %w", versionID, store.ErrConflict)
				}
				return nil
			})
		return commitAudited(ctx, p, audit, op)
	})
}
