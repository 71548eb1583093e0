package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const lockColumns = `id, kind, target, reason, created_by, created_at, expires_at`

// unexpired is the SQL condition for a row (lock or token) still in force by
// the store clock; expires_at is exclusive.
const unexpired = `(expires_at IS NULL OR expires_at > ` + nowMicros + `)`

// InsertLock adds a lock; ErrConflict on a duplicate ID. A lock whose
// ExpiresAt has passed is stored but never found.
func (s *Store) InsertLock(ctx context.Context, l store.Lock) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO locks (`+lockColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		l.ID, l.Kind, l.Target, l.Reason, l.CreatedBy, timeArg(l.CreatedAt), timeArg(l.ExpiresAt))
	if err != nil {
		return wrap("insert lock", err)
	}
	return nil
}

// ListLocks returns the locks not expired by the store clock, oldest first
// (ties by ID).
func (s *Store) ListLocks(ctx context.Context) ([]store.Lock, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+lockColumns+` FROM locks
		WHERE `+unexpired+` ORDER BY created_at, id`)
	if err != nil {
		return nil, wrap("list locks", err)
	}
	return collect(rows, "list locks", scanLock)
}

// DeleteLock removes a lock, expired or not; ErrNotFound if there is none
// with that ID.
func (s *Store) DeleteLock(ctx context.Context, id string) error {
	return execOne(ctx, s.pool, "delete lock "+id, `DELETE FROM locks WHERE id = $1`, id)
}

// FindLock returns an unexpired lock on (kind, target), by the store clock,
// the oldest if there are several; ErrNotFound if there is none.
func (s *Store) FindLock(ctx context.Context, kind, target string) (store.Lock, error) {
	l, err := scanLock(s.pool.QueryRow(ctx, `SELECT `+lockColumns+` FROM locks
		WHERE kind = $1 AND target = $2 AND `+unexpired+`
		ORDER BY created_at, id LIMIT 1`, kind, target))
	if err != nil {
		return store.Lock{}, wrap("find lock", err)
	}
	return l, nil
}

func scanLock(row pgx.Row) (store.Lock, error) {
	var (
		l                store.Lock
		created, expires *int64
	)
	if err := row.Scan(&l.ID, &l.Kind, &l.Target, &l.Reason, &l.CreatedBy, &created, &expires); err != nil {
		return store.Lock{}, err
	}
	l.CreatedAt, l.ExpiresAt = timeCol(created), timeCol(expires)
	return l, nil
}
