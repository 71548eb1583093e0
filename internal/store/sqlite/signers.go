package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

const signerColumns = `version_id, public_key, key_ref, state, published_at, effective_at, grace_until, retires_at, ended_at, previous`

// signerSetIDQuery reads the verifier set's ID, which every join's answer
// carries, its columns unnamed and untyped (unnamed).
const signerSetIDQuery = `SELECT +version AS "", +stepped_at AS "" FROM signer_set WHERE id = 1`

// ListSigners returns every signer, oldest published first, and the
// verifier set version, read in one snapshot.
func (s *SQLite) ListSigners(ctx context.Context) ([]store.Signer, store.SignerSetID, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, store.SignerSetID{}, wrap("list signers", err)
	}
	defer tx.Rollback()
	var id store.SignerSetID
	if err := tx.QueryRowContext(ctx, signerSetIDQuery).Scan(&id.Version, &id.SteppedAt); err != nil {
		return nil, id, wrap("list signers: version", err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+signerColumns+` FROM signers ORDER BY published_at, version_id`)
	if err != nil {
		return nil, store.SignerSetID{}, wrap("list signers", err)
	}
	defer rows.Close()
	var out []store.Signer
	for rows.Next() {
		sg, err := scanSigner(rows)
		if err != nil {
			return nil, store.SignerSetID{}, wrap("list signers", err)
		}
		out = append(out, sg)
	}
	if err := rows.Err(); err != nil {
		return nil, store.SignerSetID{}, wrap("list signers", err)
	}
	return out, id, nil
}

// SignerSetID returns the verifier set's ID (see store.SignerStore).
func (s *SQLite) SignerSetID(ctx context.Context) (store.SignerSetID, error) {
	var id store.SignerSetID
	if err := s.r.lookup(ctx, signerSetIDQuery).Scan(&id.Version, &id.SteppedAt); err != nil {
		return id, wrap("signer set id", err)
	}
	return id, nil
}

// ApplySignerChanges writes a lifecycle step (see store.SignerStore). The
// writer runs one transaction at a time, here and through the file lock in
// any other process, and the set ID check is inside it, so of two steps
// from one set ID the second conflicts, and so does a step planned before
// a restore once the store is stepped back up to its version. The step's
// audit record is appended in the same write.
func (s *SQLite) ApplySignerChanges(ctx context.Context, expect store.SignerSetID, changes []store.SignerChange, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	if audit == nil {
		return 0, fmt.Errorf("sqlite: apply signer changes: no audit record: a signer step is never taken unaudited")
	}
	if expect.Version+1 >= store.MaxSignerSetVersion {
		return 0, fmt.Errorf("sqlite: apply signer changes: version %d: %w", expect.Version+1, store.ErrSetVersionExhausted)
	}
	for _, c := range changes {
		if err := c.CheckDropKey(); err != nil {
			return 0, fmt.Errorf("sqlite: %w", err)
		}
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		if err := stepSet(ctx, tx, "apply signer changes", expect, expect.Version+1); err != nil {
			return err
		}
		for _, c := range changes {
			if err := applySignerChange(ctx, tx, c); err != nil {
				return err
			}
		}
		return appendAuditOf(ctx, tx, fmt.Sprintf("apply signer changes from version %d", expect.Version), audit)
	})
	if err != nil {
		return 0, err
	}
	s.hub.announce(store.ChangeSigners) // every stream sends the new verifier set
	return expect.Version + 1, nil
}

// stepSet moves the verifier set from expect to version to, stamped with
// the store clock, only where the store's set ID is still expect, and
// drops the kept sets that are not of this store's sets up to expect:
// those above its version, and one at its version kept for another step
// time (or none known).
func stepSet(ctx context.Context, tx *writeTx, op string, expect store.SignerSetID, to int64) error {
	res, err := tx.ExecContext(ctx, `UPDATE signer_set SET version = ?, stepped_at = `+nowMicros+` WHERE id = 1 AND version = ? AND stepped_at = ?`,
		to, expect.Version, expect.SteppedAt)
	if err != nil {
		return wrap(op+": version", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("sqlite: %w", store.StepMoved(op, expect))
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM verifier_sets WHERE version > ? OR (version = ? AND stepped_at IS NOT ?)`,
		expect.Version, expect.Version, expect.SteppedAt); err != nil {
		return wrap(op+": drop sets not of the version's step", err)
	}
	return nil
}

func applySignerChange(ctx context.Context, tx *writeTx, c store.SignerChange) error {
	t := c.To
	if c.From == "" {
		_, err := tx.ExecContext(ctx, `INSERT INTO signers (`+signerColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			t.VersionID, t.PublicKey, t.KeyRef, t.State, timeArg(t.PublishedAt), timeArg(t.EffectiveAt),
			timeArg(t.GraceUntil), timeArg(t.RetiresAt), timeArg(t.EndedAt), t.Previous)
		if err != nil {
			return wrap("insert signer "+t.VersionID, err)
		}
		return nil
	}
	// Only the lifecycle fields change; the key reference only goes, with
	// the step that ends the signer (DropKey).
	res, err := tx.ExecContext(ctx, `UPDATE signers SET state = ?, effective_at = ?, grace_until = ?, retires_at = ?, ended_at = ?,
		key_ref = CASE WHEN ? THEN X'' ELSE key_ref END
		WHERE version_id = ? AND state = ?`,
		t.State, timeArg(t.EffectiveAt), timeArg(t.GraceUntil), timeArg(t.RetiresAt), timeArg(t.EndedAt), c.DropKey, t.VersionID, c.From)
	if err != nil {
		return wrap("update signer "+t.VersionID, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("sqlite: update signer %s: not in state %s: %w", t.VersionID, c.From, store.ErrConflict)
	}
	return nil
}

func scanSigner(row scanner) (store.Signer, error) {
	var (
		sg                                    store.Signer
		published, eff, grace, retires, ended sql.NullInt64
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
func (s *SQLite) AdvanceSignerSet(ctx context.Context, expect store.SignerSetID, to int64, set []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: advance signer set: no audit record: the set is never advanced unaudited")
	}
	if len(set) == 0 {
		return fmt.Errorf("sqlite: advance signer set to %d: no signed set: the version never moves without its set", to)
	}
	if to <= expect.Version {
		return fmt.Errorf("sqlite: advance signer set: %d is not above %d: %w", to, expect.Version, store.ErrConflict)
	}
	if to >= store.MaxSignerSetVersion {
		return fmt.Errorf("sqlite: advance signer set to %d: %w", to, store.ErrSetVersionExhausted)
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		if err := stepSet(ctx, tx, "advance signer set", expect, to); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO verifier_sets (version, raw, stepped_at) SELECT ?, ?, stepped_at FROM signer_set WHERE id = 1`, to, set); err != nil {
			return wrap("advance signer set: keep its set", err)
		}
		return appendAuditOf(ctx, tx, fmt.Sprintf("advance signer set to %d", to), audit)
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeSigners)
	return nil
}

// DropSignerKey empties an ended signer's key reference (see
// store.SignerStore): one conditional write, with its audit record.
func (s *SQLite) DropSignerKey(ctx context.Context, versionID string, ref []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: drop signer key %s: no audit record: a key is never destroyed unaudited", versionID)
	}
	if len(ref) == 0 {
		return fmt.Errorf("sqlite: drop signer key %s: no reference given: %w", versionID, store.ErrConflict)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `UPDATE signers SET key_ref = X''
			WHERE version_id = ? AND state IN ('retired', 'revoked') AND key_ref = ?`, versionID, ref)
		if err != nil {
			return wrap("drop signer key "+versionID, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("sqlite: drop signer key %s: not an ended signer holding that reference: %w", versionID, store.ErrConflict)
		}
		return appendAuditOf(ctx, tx, "drop signer key "+versionID, audit)
	})
}

// PutVerifierSet keeps the set signed from the rows read with id while
// the store's set ID is still id (see store.SignerStore). The writer runs
// one transaction at a time, here and through the file lock in any other
// process, and the ID is read inside it: no step, advance or restore
// lands between the check and the insert. A set kept at the version for
// another step time is replaced.
func (s *SQLite) PutVerifierSet(ctx context.Context, id store.SignerSetID, raw []byte) error {
	if len(raw) == 0 {
		return fmt.Errorf("sqlite: put verifier set %d: no signed set", id.Version)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO verifier_sets (version, raw, stepped_at)
			SELECT version, ?, stepped_at FROM signer_set WHERE id = 1 AND version = ? AND stepped_at = ?
			ON CONFLICT (version) DO UPDATE SET raw = excluded.raw, stepped_at = excluded.stepped_at
				WHERE verifier_sets.stepped_at IS NOT excluded.stepped_at`, raw, id.Version, id.SteppedAt)
		if err != nil {
			return wrap("put verifier set", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil
		}
		// Nothing inserted: a set kept first for this very ID (no error),
		// or the ID moved on.
		var cur store.SignerSetID
		if err := tx.QueryRowContext(ctx, signerSetIDQuery).Scan(&cur.Version, &cur.SteppedAt); err != nil {
			return wrap("put verifier set: set id", err)
		}
		if cur != id {
			return fmt.Errorf("sqlite: put verifier set: %w", store.SetMoved(id, cur))
		}
		return nil
	})
}

// VerifierSets returns the kept sets above after, oldest first; the
// current version's only if kept for its step.
func (s *SQLite) VerifierSets(ctx context.Context, after int64, limit int) ([]store.PublishedSet, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT v.version, v.raw FROM verifier_sets v, signer_set c
		WHERE c.id = 1 AND v.version > ? AND (v.version < c.version OR (v.version = c.version AND v.stepped_at = c.stepped_at))
		ORDER BY v.version LIMIT ?`, after, limit)
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
