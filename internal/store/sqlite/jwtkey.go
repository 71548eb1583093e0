package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// GetJWTKey returns the JWT-SVID key version (see store.JWTKeyStore).
func (s *SQLite) GetJWTKey(ctx context.Context) (store.JWTKey, error) {
	var (
		k  store.JWTKey
		at int64
	)
	if err := s.r.QueryRowContext(ctx, `SELECT version, rotated_at FROM jwt_svid_key WHERE id = 1`).Scan(&k.Version, &at); err != nil {
		return store.JWTKey{}, wrap("get jwt key", err)
	}
	k.RotatedAt = timeCol(sql.NullInt64{Int64: at, Valid: true})
	return k, nil
}

// RotateJWTKey makes version from.Version+1 current if from, version and
// rotation time, still is (see store.JWTKeyStore), with its audit record
// in the same write.
func (s *SQLite) RotateJWTKey(ctx context.Context, from store.JWTKey, audit func(store.AuditHead) (store.AuditRecord, error)) (store.JWTKey, error) {
	if audit == nil {
		return store.JWTKey{}, fmt.Errorf("sqlite: rotate jwt key: no audit record: the key is never rotated unaudited")
	}
	var k store.JWTKey
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var at int64
		err := tx.QueryRowContext(ctx, `UPDATE jwt_svid_key SET version = version + 1, rotated_at = `+nowMicros+`
			WHERE id = 1 AND version = ? AND rotated_at = ? RETURNING version, rotated_at`, from.Version, from.RotatedAt.UnixMicro()).Scan(&k.Version, &at)
		if err == sql.ErrNoRows {
			return fmt.Errorf("sqlite: rotate jwt key: version %d made current at %s is not the current one: %w", from.Version, from.RotatedAt.Format(time.RFC3339Nano), store.ErrConflict)
		}
		if err != nil {
			return wrap("rotate jwt key", err)
		}
		k.RotatedAt = timeCol(sql.NullInt64{Int64: at, Valid: true})
		return appendAuditOf(ctx, tx, fmt.Sprintf("rotate jwt key from version %d", from.Version), audit)
	})
	if err != nil {
		return store.JWTKey{}, err
	}
	return k, nil
}
