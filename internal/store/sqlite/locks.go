package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

const lockColumns = `id, kind, target, reason, created_by, created_at, expires_at`

// unexpired is the SQL condition for a row (lock or token) still in force
// by the store clock; expires_at is exclusive.
const unexpired = `(expires_at IS NULL OR expires_at > ` + nowMicros + `)`

// InsertLock adds a lock and appends its audit record, as one write of a
// group-committed transaction; ErrConflict on a duplicate ID. A lock
// whose ExpiresAt has passed is stored but never found. A record that
// cannot be built or appended leaves no lock and the chain as it was.
func (s *SQLite) InsertLock(ctx context.Context, l store.Lock, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: insert lock %s: no audit record: a lock is never created unaudited", l.ID)
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO locks (`+lockColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?)`,
			l.ID, l.Kind, l.Target, l.Reason, l.CreatedBy, timeArg(l.CreatedAt), timeArg(l.ExpiresAt))
		if err != nil {
			return wrap("insert lock", err)
		}
		return appendAuditOf(ctx, tx, "insert lock "+l.ID, audit)
	})
	if err != nil {
		return err
	}
	// A lock may be on a token or a key that many nodes share, so every
	// open stream re-checks.
	s.hub.announce(store.ChangeStanding)
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

// DeleteLock removes a lock, expired or not, and appends its audit
// record, as one write; ErrNotFound if there is none with that ID, and a
// record that cannot be built or appended leaves the lock in force.
func (s *SQLite) DeleteLock(ctx context.Context, id string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: delete lock %s: no audit record: a lock is never deleted unaudited", id)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM locks WHERE id = ?`, id)
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
		return appendAuditOf(ctx, tx, "delete lock "+id, audit)
	})
}

// FindAnyLock returns an unexpired lock, by the store clock, on any of
// targets: the one on the earliest target in the list, and of several on
// that target the oldest (ties by ID). ErrNotFound if there is none, and
// for no targets, which runs no query.
func (s *SQLite) FindAnyLock(ctx context.Context, targets []store.LockTarget) (store.Lock, error) {
	if len(targets) == 0 {
		return store.Lock{}, wrap("find lock", sql.ErrNoRows)
	}
	l, err := scanLock(s.r.lookup(ctx, findAnyLockQuery(len(targets)), lockArgs(targets)...))
	if err != nil {
		return store.Lock{}, wrap("find lock", err)
	}
	return l, nil
}

// LockEnd returns when the last lock in force, by the store clock, on
// targets ends (zero if one has no end); ErrNotFound if none is in force,
// and for no targets, which runs no query.
func (s *SQLite) LockEnd(ctx context.Context, targets []store.LockTarget) (time.Time, error) {
	if len(targets) == 0 {
		return time.Time{}, wrap("lock end", sql.ErrNoRows)
	}
	var n, ending int64
	var last sql.NullInt64
	if err := s.r.lookup(ctx, lockEndQuery(len(targets)), lockArgs(targets)...).Scan(&n, &ending, &last); err != nil {
		return time.Time{}, wrap("lock end", err)
	}
	switch {
	case n == 0:
		return time.Time{}, wrap("lock end", sql.ErrNoRows)
	case ending < n || !last.Valid:
		return time.Time{}, nil
	}
	return time.UnixMicro(last.Int64).UTC(), nil
}

// lockEndQuery is LockEnd's query for n targets: the locks in force on
// them (a target named twice counts its locks twice, which changes
// neither answer), how many have an end, and the latest end.
func lockEndQuery(n int) string {
	var b strings.Builder
	b.WriteString(`WITH wanted (want_kind, want_target) AS (VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(`, `)
		}
		b.WriteString(`(?, ?)`)
	}
	b.WriteString(`) SELECT count(*), count(expires_at), max(expires_at) FROM wanted CROSS JOIN locks
		WHERE kind = want_kind AND target = want_target AND ` + unexpired)
	return b.String()
}

// lockArgs are findAnyLockQuery's arguments: each target's kind and value.
func lockArgs(targets []store.LockTarget) []any {
	return appendLockArgs(make([]any, 0, 2*len(targets)), targets)
}

// appendLockArgs appends lockArgs(targets) to args.
func appendLockArgs(args []any, targets []store.LockTarget) []any {
	for _, t := range targets {
		args = append(args, lockKindArg(t.Kind), t.Target)
	}
	return args
}

// lockKindArgs are the lock kinds as arguments, each boxed once: a join's
// and a renewal's lock checks pass a kind per target, two to five, and
// boxing a string that is not a constant allocates.
var lockKindArgs = [...]any{store.LockNode, store.LockInstance, store.LockToken, store.LockPublicKey, store.LockAdmin}

func lockKindArg(kind string) any {
	for _, a := range lockKindArgs {
		if a.(string) == kind {
			return a
		}
	}
	return kind
}

// findAnyLockQueries[n] is FindAnyLock's query for n targets: the targets
// as a VALUES table numbered by position, each looked up through the
// (kind, target) index, the first match by position winning. One text per
// count makes each a prepared statement that the read pool caches; the
// lock checks of a join or renewal have two to five targets.
var findAnyLockQueries = func() (qs [8]string) {
	for n := 1; n < len(qs); n++ {
		qs[n] = buildFindAnyLockQuery(n)
	}
	return qs
}()

func findAnyLockQuery(n int) string {
	if n < len(findAnyLockQueries) {
		return findAnyLockQueries[n]
	}
	return buildFindAnyLockQuery(n)
}

func buildFindAnyLockQuery(n int) string {
	var b strings.Builder
	b.WriteString(`WITH wanted (pos, want_kind, want_target) AS (VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(`, `)
		}
		fmt.Fprintf(&b, `(%d, ?, ?)`, i)
	}
	// CROSS JOIN keeps wanted the outer loop: a few index lookups,
	// whatever the planner guesses about the size of locks.
	b.WriteString(`) SELECT ` + lockColumns + ` FROM wanted CROSS JOIN locks
		WHERE kind = want_kind AND target = want_target AND ` + unexpired + `
		ORDER BY pos, created_at, id LIMIT 1`)
	return b.String()
}
