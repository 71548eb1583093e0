package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

const pskColumns = `id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at`

// InsertPSK adds a PSK. ErrConflict if its ID exists, or if another PSK
// already has its status and that status is active or grace: the partial
// unique index bootstrap_psks_one_per_live_status enforces the invariant.
func (s *SQLite) InsertPSK(ctx context.Context, p store.PSK, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: insert psk %s: no audit record: a psk is never created unaudited", p.ID)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO bootstrap_psks
			(id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`,
			p.ID, p.Ciphertext, p.Nonce, p.Status,
			timeArg(p.CreatedAt), timeArg(p.GraceExpiresAt), timeArg(p.RevokedAt)); err != nil {
			return wrap("insert psk", err)
		}
		return appendAuditOf(ctx, tx, "insert psk "+p.ID, audit)
	})
}

// listPSKsQuery is ListPSKs' statement, which a PSK join runs; its columns
// are unnamed and untyped (unnamed).
var listPSKsQuery = `SELECT ` + unnamed(pskColumns) + ` FROM bootstrap_psks ORDER BY created_at DESC, id DESC`

// ListPSKs returns every PSK, newest first (ties by ID, descending).
func (s *SQLite) ListPSKs(ctx context.Context) ([]store.PSK, error) {
	rows, err := s.r.QueryContext(ctx, listPSKsQuery)
	if err != nil {
		return nil, wrap("list psks", err)
	}
	defer rows.Close()
	var ps []store.PSK
	for rows.Next() {
		p, err := scanPSK(rows)
		if err != nil {
			return nil, wrap("list psks", err)
		}
		ps = append(ps, p)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list psks", err)
	}
	return ps, nil
}

// RotatePSK replaces the active PSK fromID with newPSK (see store.Store).
// The writer runs one transaction at a time, in this process and, through
// the file lock, in any other; the check that fromID is still active is
// made inside that transaction, so of two rotations from one active PSK
// the second finds it in grace and conflicts. On any error nothing of
// the write is written.
func (s *SQLite) RotatePSK(ctx context.Context, fromID string, p store.PSK, grace time.Duration, audit func(store.AuditHead) (store.AuditRecord, error)) (store.PSK, error) {
	if audit == nil {
		return store.PSK{}, fmt.Errorf("sqlite: rotate psk %s: no audit record: a psk is never rotated unaudited", fromID)
	}
	var old store.PSK
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var err error
		if old, err = rotatePSK(ctx, tx, fromID, p, grace); err != nil {
			return err
		}
		return appendAuditOf(ctx, tx, "rotate psk "+fromID, audit)
	})
	if err != nil {
		return store.PSK{}, err
	}
	return old, nil
}

// rotatePSK is RotatePSK's work inside the write transaction.
func rotatePSK(ctx context.Context, tx *writeTx, fromID string, p store.PSK, grace time.Duration) (store.PSK, error) {
	// One reading of the clock, so the revocation, the grace expiry and a
	// defaulted creation time agree.
	var now int64
	if err := tx.QueryRowContext(ctx, `SELECT `+nowMicros).Scan(&now); err != nil {
		return store.PSK{}, wrap("rotate psk: now", err)
	}
	var status string
	err := tx.QueryRowContext(ctx, `SELECT status FROM bootstrap_psks WHERE id = ?`, fromID).Scan(&status)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return store.PSK{}, wrap("rotate psk", err)
	}
	if status != store.PSKActive {
		return store.PSK{}, fmt.Errorf("sqlite: rotate psk: %s is not the active psk: %w", fromID, store.ErrConflict)
	}

	// The grace slot is freed first: the partial unique index admits one
	// grace PSK.
	if _, err := tx.ExecContext(ctx, `UPDATE bootstrap_psks
		SET status = 'revoked', grace_expires_at = NULL, revoked_at = ?
		WHERE status = 'grace'`, now); err != nil {
		return store.PSK{}, wrap("rotate psk: revoke grace", err)
	}
	if grace > 0 {
		_, err = tx.ExecContext(ctx, `UPDATE bootstrap_psks
			SET status = 'grace', grace_expires_at = ? WHERE id = ?`, now+grace.Microseconds(), fromID)
	} else {
		_, err = tx.ExecContext(ctx, `UPDATE bootstrap_psks
			SET status = 'revoked', revoked_at = ? WHERE id = ?`, now, fromID)
	}
	if err != nil {
		return store.PSK{}, wrap("rotate psk: retire active", err)
	}

	created := timeArg(p.CreatedAt)
	if created == nil {
		created = now
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO bootstrap_psks (`+pskColumns+`)
		VALUES (?, ?, ?, 'active', ?, NULL, NULL)`,
		p.ID, p.Ciphertext, p.Nonce, created); err != nil {
		return store.PSK{}, wrap("rotate psk: insert", err)
	}
	old, err := scanPSK(tx.QueryRowContext(ctx, `SELECT `+pskColumns+` FROM bootstrap_psks WHERE id = ?`, fromID))
	if err != nil {
		return store.PSK{}, wrap("rotate psk: read back", err)
	}
	return old, nil
}

// RevokeExpiredGracePSKs revokes the grace PSKs whose grace has ended by
// the store clock and returns their IDs in ascending order, with their
// audit record in the same write when there are any.
func (s *SQLite) RevokeExpiredGracePSKs(ctx context.Context, audit func([]string) func(store.AuditHead) (store.AuditRecord, error)) ([]string, error) {
	if audit == nil {
		return nil, fmt.Errorf("sqlite: revoke expired grace psks: no audit record: a psk is never revoked unaudited")
	}
	return s.sweepAudited(ctx, "revoke expired grace psks", `UPDATE bootstrap_psks
		SET status = 'revoked', grace_expires_at = NULL, revoked_at = `+nowMicros+`
		WHERE status = 'grace' AND grace_expires_at <= `+nowMicros+`
		RETURNING id`, nil,
		audit, "a psk is never revoked unaudited")
}

func scanPSK(row scanner) (store.PSK, error) {
	var (
		p                       store.PSK
		created, grace, revoked sql.NullInt64
	)
	if err := row.Scan(&p.ID, &p.Ciphertext, &p.Nonce, &p.Status, &created, &grace, &revoked); err != nil {
		return store.PSK{}, err
	}
	p.CreatedAt, p.GraceExpiresAt, p.RevokedAt = timeCol(created), timeCol(grace), timeCol(revoked)
	return p, nil
}
