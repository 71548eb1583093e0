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
	k, err := scanJWTKey(s.r.QueryRowContext(ctx, `SELECT `+jwtKeyColumns+` FROM jwt_svid_key WHERE id = 1`))
	if err != nil {
		return store.JWTKey{}, wrap("get jwt key", err)
	}
	return k, nil
}

const jwtKeyColumns = `version, rotated_at, prev_salt, salt, next_salt`

func scanJWTKey(row *sql.Row) (store.JWTKey, error) {
	var (
		k                    store.JWTKey
		at                   int64
		prev, salt, nextSalt sql.NullString
	)
	if err := row.Scan(&k.Version, &at, &prev, &salt, &nextSalt); err != nil {
		return store.JWTKey{}, err
	}
	k.RotatedAt = timeCol(sql.NullInt64{Int64: at, Valid: true})
	k.PrevSalt, k.Salt, k.NextSalt = prev.String, salt.String, nextSalt.String
	return k, nil
}

// RotateJWTKey makes version from.Version+1 current if from, version and
// rotation time, still is (see store.JWTKeyStore), moving the salts along
// and drawing the next, with its audit record in the same write.
func (s *SQLite) RotateJWTKey(ctx context.Context, from store.JWTKey, audit func(store.AuditHead) (store.AuditRecord, error)) (store.JWTKey, error) {
	if audit == nil {
		return store.JWTKey{}, fmt.Errorf("sqlite: rotate jwt key: no audit record: the key is never rotated unaudited")
	}
	var k store.JWTKey
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var err error
		k, err = scanJWTKey(tx.QueryRowContext(ctx, `UPDATE jwt_svid_key SET version = version + 1, rotated_at = `+nowMicros+`,
			prev_salt = salt, salt = next_salt, next_salt = ?
			WHERE id = 1 AND version = ? AND rotated_at = ? RETURNING `+jwtKeyColumns, store.NewJWTKeySalt(), from.Version, from.RotatedAt.UnixMicro()))
		if err == sql.ErrNoRows {
			return fmt.Errorf("sqlite: rotate jwt key: version %d made current at %s is not the current one: %w", from.Version, from.RotatedAt.Format(time.RFC3339Nano), store.ErrConflict)
		}
		if err != nil {
			return wrap("rotate jwt key", err)
		}
		return appendAuditOf(ctx, tx, fmt.Sprintf("rotate jwt key from version %d", from.Version), audit)
	})
	if err != nil {
		return store.JWTKey{}, err
	}
	return k, nil
}
