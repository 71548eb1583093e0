package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// InsertPSK adds a PSK. ErrConflict if its ID exists, or if another PSK
// already has its status and that status is active or grace: the partial
// unique index bootstrap_psks_one_per_live_status enforces the invariant
// across processes.
func (s *Store) InsertPSK(ctx context.Context, p store.PSK) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO bootstrap_psks
		(id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		p.ID, p.Ciphertext, p.Nonce, p.Status,
		timeArg(p.CreatedAt), timeArg(p.GraceExpiresAt), timeArg(p.RevokedAt))
	if err != nil {
		return wrap("insert psk", err)
	}
	return nil
}

// ListPSKs returns every PSK, newest first (ties by ID, descending).
func (s *Store) ListPSKs(ctx context.Context) ([]store.PSK, error) {
	rows, err := s.pool.Query(ctx, `SELECT
		id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at
		FROM bootstrap_psks ORDER BY created_at DESC, id DESC`)
	if err != nil {
		return nil, wrap("list psks", err)
	}
	return collect(rows, "list psks", func(row pgx.Row) (store.PSK, error) {
		var (
			p                       store.PSK
			created, grace, revoked *int64
		)
		if err := row.Scan(&p.ID, &p.Ciphertext, &p.Nonce, &p.Status, &created, &grace, &revoked); err != nil {
			return store.PSK{}, err
		}
		p.CreatedAt, p.GraceExpiresAt, p.RevokedAt = timeCol(created), timeCol(grace), timeCol(revoked)
		return p, nil
	})
}
