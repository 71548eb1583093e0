package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

const lockColumns = `id, kind, target, reason, created_by, created_at, expires_at`

// unexpired is the SQL condition for a row (lock or token) still in force by
// the store clock; expires_at is exclusive.
const unexpired = `(expires_at IS NULL OR expires_at > ` + nowMicros + `)`

// InsertLock adds a lock; ErrConflict on a duplicate ID. A lock whose
// ExpiresAt has passed is stored but never found. One transaction of two
// round trips (pipe): BEGIN, the target's advisory lock, the
// INSERT, the notification, the audit link's baton (chain.go); then the
// audit record with COMMIT. A record that cannot be built or appended
// rolls the lock back.
func (s *Store) InsertLock(ctx context.Context, l store.Lock, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: insert lock %s: no audit record: a lock is never created unaudited", l.ID)
	}
	op := "insert lock " + l.ID
	return s.inPipe(ctx, op, func(p *pipe) error {
		// The target's advisory lock, exclusive, first: a join or renewal
		// whose lock check has begun (targetLocksQuery, then the check)
		// commits before this lock can, and one that checks later waits
		// for this commit and sees the lock.
		p.exec(targetLockQuery, []any{lockTargetClass, l.Kind + " " + l.Target}, wrapped("insert lock: lock target"))
		p.exec(insertLockQuery, lockArgsOf(l), wrapped("insert lock"))
		// A lock may be on a token or a key that many nodes share, so
		// every open stream re-checks.
		queueNotify(p, store.ChangeStanding)
		return commitAudited(ctx, p, audit, op)
	})
}

// commitAudited appends audit's record after what p has queued and
// commits both (startAudit, then link.commit), or neither.
func commitAudited(ctx context.Context, p *pipe, audit func(store.AuditHead) (store.AuditRecord, error), op string) error {
	_, err := commitAuditRecord(ctx, p, audit, op)
	return err
}

// commitAuditRecord is commitAudited returning the record appended:
// AppendAudit's, whose pipe queues nothing before it.
func commitAuditRecord(ctx context.Context, p *pipe, audit func(store.AuditHead) (store.AuditRecord, error), op string) (store.AuditRecord, error) {
	l := p.startAudit()
	defer l.end()
	if err := p.send(ctx); err != nil {
		return store.AuditRecord{}, err
	}
	return l.commit(ctx, p, audit, op)
}

const insertLockQuery = `INSERT INTO locks (` + lockColumns + `) VALUES ($1, $2, $3, $4, $5, $6, $7)`

func lockArgsOf(l store.Lock) []any {
	return []any{l.ID, l.Kind, l.Target, l.Reason, l.CreatedBy, timeArg(l.CreatedAt), timeArg(l.ExpiresAt)}
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

// DeleteLock removes a lock, expired or not, with its audit record in the
// same transaction (as InsertLock); ErrNotFound if there is none with
// that ID, and a record that cannot be built or appended leaves the lock.
func (s *Store) DeleteLock(ctx context.Context, id string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: delete lock %s: no audit record: a lock is never deleted unaudited", id)
	}
	op := "delete lock " + id
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`DELETE FROM locks WHERE id = $1`, []any{id}, func(tag pgconn.CommandTag, err error) error {
			if err == nil && tag.RowsAffected() == 0 {
				err = pgx.ErrNoRows
			}
			if err != nil {
				return wrap(op, err)
			}
			return nil
		})
		return commitAudited(ctx, p, audit, op)
	})
}

// FindAnyLock returns an unexpired lock, by the store clock, on any of
// targets: the one on the earliest target in the list, and of several on
// that target the oldest (ties by ID). ErrNotFound if there is none, and
// for no targets, which runs no query.
//
// The targets travel as two arrays, so one statement text serves any
// number of them and pgx prepares it once per connection; WITH ORDINALITY
// numbers them for the ordering, and each is looked up through the
// (kind, target) index.
func (s *Store) FindAnyLock(ctx context.Context, targets []store.LockTarget) (store.Lock, error) {
	if len(targets) == 0 {
		return store.Lock{}, wrap("find lock", pgx.ErrNoRows)
	}
	kinds, names := lockArgs(targets)
	l, err := scanLock(s.pool.QueryRow(ctx, findLockQuery, kinds, names))
	if err != nil {
		return store.Lock{}, wrap("find lock", err)
	}
	return l, nil
}

// LockEnd returns when the last lock in force, by the store clock, on
// targets ends (zero if one has no end); ErrNotFound if none is in force,
// and for no targets, which runs no query.
func (s *Store) LockEnd(ctx context.Context, targets []store.LockTarget) (time.Time, error) {
	if len(targets) == 0 {
		return time.Time{}, wrap("lock end", pgx.ErrNoRows)
	}
	kinds, names := lockArgs(targets)
	var n, ending int64
	var last *int64
	if err := s.pool.QueryRow(ctx, lockEndQuery, kinds, names).Scan(&n, &ending, &last); err != nil {
		return time.Time{}, wrap("lock end", err)
	}
	switch {
	case n == 0:
		return time.Time{}, wrap("lock end", pgx.ErrNoRows)
	case ending < n:
		return time.Time{}, nil
	}
	return timeCol(last), nil
}

// lockEndQuery is LockEnd's query: the locks in force on the targets
// whose kinds and names are $1 and $2, how many have an end, and the
// latest end.
const lockEndQuery = `SELECT count(*), count(expires_at), max(expires_at)
	FROM unnest($1::text[], $2::text[]) AS wanted (want_kind, want_target)
	JOIN locks ON kind = want_kind AND target = want_target
	WHERE ` + unexpired

// findLockQuery is FindAnyLock's query: the lock in force on the earliest
// of the targets, whose kinds and names are $1 and $2 (lockArgs).
const findLockQuery = `SELECT ` + lockColumns + `
	FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS wanted (want_kind, want_target, pos)
	JOIN locks ON kind = want_kind AND target = want_target
	WHERE ` + unexpired + `
	ORDER BY pos, created_at, id LIMIT 1`

// findLockQuery3 is findLockQuery with the kinds and names as $3 and $4.
const findLockQuery3 = `SELECT ` + lockColumns + `
	FROM unnest($3::text[], $4::text[]) WITH ORDINALITY AS wanted (want_kind, want_target, pos)
	JOIN locks ON kind = want_kind AND target = want_target
	WHERE ` + unexpired + `
	ORDER BY pos, created_at, id LIMIT 1`

// targetLockQuery takes a lock target's advisory lock ($2: its kind, a
// space, its target) exclusive for the transaction: InsertLock's.
// targetLocksQuery takes those of the targets whose kinds and names are
// $2 and $3 shared: a join's or renewal's, before the statement that
// checks their locks. In READ COMMITTED that statement's snapshot is
// taken after the wait, so it sees any lock whose creation it waited for;
// a creation that comes later waits for the write's commit. Shared
// holders never wait for each other, and a creation holds one key only,
// so no cycle of waits forms. A hash collision only makes one wait for
// the other.
const (
	targetLockQuery  = `SELECT pg_advisory_xact_lock($1, hashtext($2))`
	targetLocksQuery = `SELECT count(pg_advisory_xact_lock_shared($1, hashtext(k || ' ' || t)))
		FROM unnest($2::text[], $3::text[]) AS w (k, t)`
)

// lockFreeCondition is the SQL condition that no lock is in force, by the
// store clock, on any of the targets whose kinds and names are the arrays
// $k and $t (each looked up through the (kind, target) index).
func lockFreeCondition(k, t int) string {
	return fmt.Sprintf(`NOT EXISTS (SELECT 1 FROM unnest($%d::text[], $%d::text[]) AS w (want_kind, want_target)
		JOIN locks ON kind = want_kind AND target = want_target WHERE `+unexpired+`)`, k, t)
}

// queueLockCheck queues, on p, the shared advisory locks of targets and
// then their lock check: a lock in force refuses the write with a
// *store.LockedError naming it. Nothing is queued for no targets.
func queueLockCheck(p *pipe, op string, targets []store.LockTarget) {
	if len(targets) == 0 {
		return
	}
	kinds, names := lockArgs(targets)
	p.exec(targetLocksQuery, []any{lockTargetClass, kinds, names}, wrapped(op+": lock targets"))
	p.row(findLockQuery, []any{kinds, names}, func(row pgx.Row) error {
		l, err := scanLock(row)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return wrap(op+": find lock", err)
		}
		return fmt.Errorf("postgres: %s: %w", op, &store.LockedError{Lock: l})
	})
}

func lockArgs(targets []store.LockTarget) (kinds, names []string) {
	kinds, names = make([]string, len(targets)), make([]string, len(targets))
	for i, t := range targets {
		kinds[i], names[i] = t.Kind, t.Target
	}
	return kinds, names
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

// sweepAudited runs a cleaner's statement, one row of the IDs it changed
// in ascending order, and appends audit(ids)'s record in its transaction;
// it rolls back and appends nothing when no row changed. A nil record is
// refused with unaudited, the invariant it would break.
func (s *Store) sweepAudited(ctx context.Context, op, sql string, args []any, audit func([]string) func(store.AuditHead) (store.AuditRecord, error), unaudited string) ([]string, error) {
	var ids []string
	err := s.inPipe(ctx, op, func(p *pipe) error {
		p.row(sql, args, func(row pgx.Row) error {
			if err := row.Scan(&ids); err != nil {
				return wrap(op, err)
			}
			return nil
		})
		if err := p.send(ctx); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil // rolled back: nothing to write
		}
		build := audit(ids)
		if build == nil {
			return fmt.Errorf("postgres: %s %v: no audit record: %s", op, ids, unaudited)
		}
		return commitAudited(ctx, p, build, op)
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}
