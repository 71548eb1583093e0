package sqlite

import (
	"context"
	"database/sql"

	"github.com/muster-dev/muster/internal/store"
)

const lockColumns = `id, kind, target, reason, created_by, created_at, expires_at`

// unexpired is the SQL condition for a row (lock or token) still in force
// by the store clock; expires_at is exclusive.
const unexpired = `(expires_at IS NULL OR expires_at > ` + nowMicros + `)`

// InsertLock adds a lock; ErrConflict on a duplicate ID. A lock whose
// ExpiresAt has passed is stored but never found.
func (s *SQLite) InsertLock(ctx context.Context, l store.Lock) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO locks (`+lockColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?)`,
		l.ID, l.Kind, l.Target, l.Reason, l.CreatedBy, timeArg(l.CreatedAt), timeArg(l.ExpiresAt))
	if err != nil {
		return wrap("insert lock", err)
	}
	return nil
}

// ListLocks returns the locks not expired by the store clock, oldest first
// (ties by ID).
func (s *SQLite) ListLocks(ctx context.Context) ([]store.Lock, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+lockColumns+` FROM locks
		WHERE `+unexpired+` ORDER BY created_at, id`)
	if err != nil {
		return nil, wrap("list locks", err)
	}
	defer rows.Close()
	var ls []store.Lock
	for rows.Next() {
		l, err := scanLock(rows)
		if err != nil {
			return nil, wrap("list locks", err)
		}
		ls = append(ls, l)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list locks", err)
	}
	return ls, nil
}

// DeleteLock removes a lock, expired or not; ErrNotFound if there is none
// with that ID.
func (s *SQLite) DeleteLock(ctx context.Context, id string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM locks WHERE id = ?`, id)
	if err != nil {
		return wrap("delete lock", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return wrap("delete lock", err)
	}
	if n == 0 {
		return wrap("delete lock "+id, sql.ErrNoRows)
	}
	return nil
}

// FindLock returns an unexpired lock on (kind, target), by the store clock,
// the oldest if there are several; ErrNotFound if there is none.
func (s *SQLite) FindLock(ctx context.Context, kind, target string) (store.Lock, error) {
	l, err := scanLock(s.r.QueryRowContext(ctx, `SELECT `+lockColumns+` FROM locks
		WHERE kind = ? AND target = ? AND `+unexpired+`
		ORDER BY created_at, id LIMIT 1`, kind, target))
	if err != nil {
		return store.Lock{}, wrap("find lock", err)
	}
	return l, nil
}

func scanLock(row interface{ Scan(...any) error }) (store.Lock, error) {
	var (
		l                store.Lock
		created, expires sql.NullInt64
	)
	if err := row.Scan(&l.ID, &l.Kind, &l.Target, &l.Reason, &l.CreatedBy, &created, &expires); err != nil {
		return store.Lock{}, err
	}
	l.CreatedAt, l.ExpiresAt = timeCol(created), timeCol(expires)
	return l, nil
}
