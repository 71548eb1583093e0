package sqlite

import (
	"context"
	"database/sql"

	"github.com/muster-dev/muster/internal/store"
)

// InsertPSK adds a PSK. ErrConflict if its ID exists, or if another PSK
// already has its status and that status is active or grace: the partial
// unique index bootstrap_psks_one_per_live_status enforces the invariant.
func (s *SQLite) InsertPSK(ctx context.Context, p store.PSK) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO bootstrap_psks
		(id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`,
		p.ID, p.Ciphertext, p.Nonce, p.Status,
		timeArg(p.CreatedAt), timeArg(p.GraceExpiresAt), timeArg(p.RevokedAt))
	if err != nil {
		return wrap("insert psk", err)
	}
	return nil
}

// ListPSKs returns every PSK, newest first (ties by ID, descending).
func (s *SQLite) ListPSKs(ctx context.Context) ([]store.PSK, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT
		id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at
		FROM bootstrap_psks ORDER BY created_at DESC, id DESC`)
	if err != nil {
		return nil, wrap("list psks", err)
	}
	defer rows.Close()
	var ps []store.PSK
	for rows.Next() {
		var (
			p                       store.PSK
			created, grace, revoked sql.NullInt64
		)
		if err := rows.Scan(&p.ID, &p.Ciphertext, &p.Nonce, &p.Status, &created, &grace, &revoked); err != nil {
			return nil, wrap("list psks", err)
		}
		p.CreatedAt, p.GraceExpiresAt, p.RevokedAt = timeCol(created), timeCol(grace), timeCol(revoked)
		ps = append(ps, p)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list psks", err)
	}
	return ps, nil
}
