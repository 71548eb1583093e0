package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// GetJWTKey returns the JWT-SVID key version (see store.JWTKeyStore).
func (s *Store) GetJWTKey(ctx context.Context) (store.JWTKey, error) {
	var (
		k  store.JWTKey
		at int64
	)
	if err := s.pool.QueryRow(ctx, `SELECT version, rotated_at FROM jwt_svid_key WHERE id = 1`).Scan(&k.Version, &at); err != nil {
		return store.JWTKey{}, wrap("get jwt key", err)
	}
	k.RotatedAt = timeCol(&at)
	return k, nil
}

// RotateJWTKey makes version from+1 current if from still is (see
// store.JWTKeyStore): one UPDATE conditional on the version, so of two
// rotations from one version exactly one succeeds.
func (s *Store) RotateJWTKey(ctx context.Context, from int64) (store.JWTKey, error) {
	var (
		k  store.JWTKey
		at int64
	)
	err := s.pool.QueryRow(ctx, `UPDATE jwt_svid_key SET version = version + 1, rotated_at = `+nowMicros+`
		WHERE id = 1 AND version = $1 RETURNING version, rotated_at`, from).Scan(&k.Version, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.JWTKey{}, fmt.Errorf("postgres: rotate jwt key: version %d is not the current one: %w", from, store.ErrConflict)
	}
	if err != nil {
		return store.JWTKey{}, wrap("rotate jwt key", err)
	}
	k.RotatedAt = timeCol(&at)
	return k, nil
}
