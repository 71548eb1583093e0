package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// GetJWTKey returns the JWT-SVID key version (see store.JWTKeyStore).
func (s *Store) GetJWTKey(ctx context.Context) (store.JWTKey, error) {
	k, err := scanJWTKey(s.pool.QueryRow(ctx, `SELECT `+jwtKeyColumns+` FROM jwt_svid_key WHERE id = 1`))
	if err != nil {
		return store.JWTKey{}, wrap("get jwt key", err)
	}
	return k, nil
}

const jwtKeyColumns = `version, rotated_at, prev_salt, salt, next_salt`

func scanJWTKey(row pgx.Row) (store.JWTKey, error) {
	var (
		k                    store.JWTKey
		at                   int64
		prev, salt, nextSalt *string
	)
	if err := row.Scan(&k.Version, &at, &prev, &salt, &nextSalt); err != nil {
		return store.JWTKey{}, err
	}
	k.RotatedAt = timeCol(&at)
	k.PrevSalt, k.Salt, k.NextSalt = orEmpty(prev), orEmpty(salt), orEmpty(nextSalt)
	return k, nil
}

// orEmpty is a nullable text column's value, "" for NULL.
func orEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// RotateJWTKey makes version from.Version+1 current if from still is
// (see store.JWTKeyStore), moving the salts along and drawing the next:
// one UPDATE conditional on the version and its rotation's time, so of
// two rotations from one read exactly one succeeds, and none from a read
// lost with a restore, and its audit record in the same transaction (one
// pipe, as InsertLock).
func (s *Store) RotateJWTKey(ctx context.Context, from store.JWTKey, audit func(store.AuditHead) (store.AuditRecord, error)) (store.JWTKey, error) {
	if audit == nil {
		return store.JWTKey{}, fmt.Errorf("postgres: rotate jwt key: no audit record: the key is never rotated unaudited")
	}
	var k store.JWTKey
	op := fmt.Sprintf("rotate jwt key from version %d", from.Version)
	err := s.inPipe(ctx, op, func(p *pipe) error {
		p.row(`UPDATE jwt_svid_key SET version = version + 1, rotated_at = `+nowMicros+`,
			prev_salt = salt, salt = next_salt, next_salt = $3
			WHERE id = 1 AND version = $1 AND rotated_at = $2 RETURNING `+jwtKeyColumns,
			[]any{from.Version, from.RotatedAt.UnixMicro(), store.NewJWTKeySalt()}, func(row pgx.Row) error {
				var err error
				k, err = scanJWTKey(row)
				if errors.Is(err, pgx.ErrNoRows) {
					return fmt.Errorf("postgres: rotate jwt key: version %d made current at %s is not the current one: %w", from.Version, from.RotatedAt.Format(time.RFC3339Nano), store.ErrConflict)
				}
				if err != nil {
					return wrap("rotate jwt key", err)
				}
				return nil
			})
		return commitAudited(ctx, p, audit, op)
	})
	if err != nil {
		return store.JWTKey{}, err
	}
	return k, nil
}
