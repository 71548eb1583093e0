package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// defaultAuditLimit is the ListAudit page size when the filter sets none.
const defaultAuditLimit = 1000

const auditColumns = `seq, time, actor, action, target, result, reason, source, correlation_id, prev_hash, hash`

// AppendAudit appends one record to the chain. The head (read, or the
// one the last transaction left, which the insert checks: appendAudit),
// the call to build and the insert run as one write of a group-committed
// transaction on the single writer connection (batch.go), so appends are serialized
// both within this process and against any other process on the file. The
// record must have Seq head.Seq+1 and PrevHash head.Hash, else ErrConflict
// and nothing is written; an error from build is returned wrapped and
// nothing is written. build runs while the writer is held, so it delays
// every write batched with it; if it writes to the store it deadlocks until
// ctx ends.
func (s *SQLite) AppendAudit(ctx context.Context, build func(head store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error) {
	var rec store.AuditRecord
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var err error
		rec, err = appendAudit(ctx, tx, build)
		return err
	})
	if err != nil {
		return store.AuditRecord{}, err
	}
	return rec, nil
}

// appendAuditOf appends, in tx, the record build makes of the write op
// names; its error names op.
func appendAuditOf(ctx context.Context, tx *writeTx, op string, build func(store.AuditHead) (store.AuditRecord, error)) error {
	if _, err := appendAudit(ctx, tx, build); err != nil {
		return fmt.Errorf("sqlite: %s: its audit record: %w", op, err)
	}
	return nil
}

// appendAudit is AppendAudit's work inside the write transaction.
func appendAudit(ctx context.Context, tx *writeTx, build func(head store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error) {
	var (
		head     store.AuditHead
		headTime int64
		guessed  bool
		err      error
	)
	if !tx.head.known && tx.guess.known {
		// The head the last transaction left, not read again: the insert
		// below checks it is still the head (another process on the
		// file may have appended since), which a transaction of one
		// write (a renewal, at a fleet's steady rate) does for two
		// lookups inside its own statement rather than a query of its
		// own.
		head, headTime, guessed = tx.guess.head, tx.guess.time, true
	} else if head, headTime, err = tx.chainHead(ctx); err != nil {
		return store.AuditRecord{}, wrap("append audit", err)
	}
	rec, err := store.BuildAuditRecord(head, build)
	if err != nil {
		return store.AuditRecord{}, fmt.Errorf("sqlite: append audit: %w", err)
	}

	// Until the record and its clock step are both in, the chain's head
	// is not known: a failed statement here leaves it either way.
	tx.head.known = false
	recTime := timeArg(rec.Time).(int64) // BuildAuditRecord refuses a zero time
	// Each boxed once: boxing allocates, and insertAuditOnHeadQuery takes
	// the seq and the prev hash again.
	seq, prev := any(rec.Seq), any(rec.PrevHash)
	args := make([]any, 0, 14)
	args = append(args, seq, recTime, rec.Actor, rec.Action, rec.Target, rec.Result,
		rec.Reason, rec.Source, rec.CorrelationID, prev)
	if guessed {
		args = append(args, seq, seq, prev, rec.Hash)
		res, err := tx.ExecContext(ctx, insertAuditOnHeadQuery, args...)
		if err != nil {
			return store.AuditRecord{}, wrap("append audit", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return store.AuditRecord{}, wrap("append audit", err)
		}
		if n == 0 {
			// The guess was not the head: build again on the head read
			// in this transaction, which holds the write lock.
			tx.guess.known = false
			return appendAudit(ctx, tx, build)
		}
	} else if _, err := tx.ExecContext(ctx, insertAuditQuery, append(args, rec.Hash)...); err != nil {
		return store.AuditRecord{}, wrap("append audit", err)
	}
	if head.Seq > 0 && recTime < headTime {
		// The clock stepped back: a new run of non-decreasing times
		// starts here (auditSeqFrom).
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit_clock_steps (seq) VALUES (?)`, rec.Seq); err != nil {
			return store.AuditRecord{}, wrap("append audit: clock step", err)
		}
	}
	tx.head = txHead{known: true, head: store.AuditHead{Seq: rec.Seq, Hash: rec.Hash}, time: recTime}
	return rec, nil
}

const insertAuditQuery = `INSERT INTO audit_records (` + auditColumns + `)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

// insertAuditOnHeadQuery inserts the record (the first ten of
// insertAuditQuery's arguments) only if the chain's head is the one it
// was built on: no record at its seq or after, and the one before it
// (none for the first record, whose prev hash is NULL) holding its prev
// hash, both lookups of the rowid (seq); the seq twice and the prev hash
// again are its next three arguments, the hash the last. Otherwise its
// hash is NULL, which the table refuses (NOT NULL) and OR IGNORE turns
// into no row inserted; as does a seq taken already. One row of VALUES,
// not INSERT … SELECT: a SELECT that reads the table it inserts into is
// run into a temporary table first. Its parameters are plain ?s, an
// argument used twice passed twice: the driver asks SQLite every
// parameter's name at every bind, and a numbered one's (?1) is a string
// it makes each time.
const insertAuditOnHeadQuery = `INSERT OR IGNORE INTO audit_records (` + auditColumns + `)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?,
		CASE WHEN NOT EXISTS (SELECT 1 FROM audit_records WHERE seq >= ?)
			AND (SELECT hash FROM audit_records WHERE seq = ? - 1) IS ? THEN ? END)`

// txHead is the audit chain's head as a write transaction has left it
// (known once the transaction read it or appended to it), so that the
// writes of a batch after the first append without reading it: they
// append one after another in the one transaction, and nothing else can
// append to the chain while it runs. The writer's transactions begin
// IMMEDIATE, holding the database's write lock from their start to their
// end, so no other connection, in this process or another, writes the
// file meanwhile; in the transaction, only appendAudit writes
// audit_records. A write rolled back to its savepoint makes the
// transaction forget it (batch.go, runOnce), as the write may have
// appended; a transaction run again starts without it (a new writeTx).
type txHead struct {
	known bool
	head  store.AuditHead
	time  int64 // the head's time column, Unix microseconds
}

// chainHead is the chain's head and its time in the transaction, read
// from the database only when the transaction does not know it. The Hash is shared with the
// record appended last (appendAudit): it is only read, by the next
// append's BuildAuditRecord, which copies it for build, and by its insert.
func (tx *writeTx) chainHead(ctx context.Context) (store.AuditHead, int64, error) {
	if tx.head.known {
		return tx.head.head, tx.head.time, nil
	}
	h, t, err := chainHead(ctx, tx)
	if err != nil {
		return store.AuditHead{}, 0, err
	}
	tx.head = txHead{known: true, head: h, time: t}
	return h, t, nil
}

// AuditHead returns the last record's seq and hash: Seq 0 and a nil Hash
// for an empty chain.
func (s *SQLite) AuditHead(ctx context.Context) (store.AuditHead, error) {
	h, err := auditHead(ctx, s.r)
	if err != nil {
		return store.AuditHead{}, wrap("audit head", err)
	}
	return h, nil
}

func auditHead(ctx context.Context, q queryer) (store.AuditHead, error) {
	h, _, err := chainHead(ctx, q)
	return h, err
}

// chainHeadQuery reads the chain's head, its columns unnamed and untyped
// (unnamed): an append that does not know the head reads it.
const chainHeadQuery = `SELECT +seq AS "", +hash AS "", +time AS "" FROM audit_records ORDER BY seq DESC LIMIT 1`

// chainHead is auditHead with the last record's time (Unix microseconds;
// 0 for an empty chain).
func chainHead(ctx context.Context, q queryer) (store.AuditHead, int64, error) {
	var (
		h store.AuditHead
		t int64
	)
	err := q.QueryRowContext(ctx, chainHeadQuery).Scan(&h.Seq, &h.Hash, &t)
	if errors.Is(err, sql.ErrNoRows) {
		return store.AuditHead{}, 0, nil
	}
	return h, t, err
}

// ListAudit returns matching records in ascending Seq. An Action ending in
// '*' matches by byte prefix, case-sensitively.
func (s *SQLite) ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditRecord, error) {
	var (
		where []string
		args  []any
	)
	afterSeq := f.AfterSeq
	if !f.Since.IsZero() {
		// The time bound stays: the seq bound only skips the records
		// before the first one it can select.
		where = append(where, `time >= ?`)
		args = append(args, timeArg(f.Since))
		from, err := s.auditSeqFrom(ctx, f.Since)
		if err != nil {
			return nil, wrap("list audit", err)
		}
		afterSeq = max(afterSeq, from-1)
	}
	if prefix, ok := strings.CutSuffix(f.Action, "*"); ok {
		// A range rather than LIKE, which ignores ASCII case and would
		// need escaping, and so that the action index serves it.
		if prefix != "" {
			where = append(where, `action >= ?`)
			args = append(args, prefix)
			if end, ok := prefixEnd(prefix); ok {
				where = append(where, `action < ?`)
				args = append(args, end)
			}
		}
	} else if f.Action != "" {
		where = append(where, `action = ?`)
		args = append(args, f.Action)
	}
	if afterSeq > 0 {
		where = append(where, `seq > ?`)
		args = append(args, afterSeq)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = defaultAuditLimit
	}
	q := `SELECT ` + auditColumns + ` FROM audit_records`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	q += ` ORDER BY seq LIMIT ?`
	args = append(args, limit)

	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, wrap("list audit", err)
	}
	defer rows.Close()
	var recs []store.AuditRecord
	for rows.Next() {
		var (
			r store.AuditRecord
			t sql.NullInt64
		)
		if err := rows.Scan(&r.Seq, &t, &r.Actor, &r.Action, &r.Target, &r.Result,
			&r.Reason, &r.Source, &r.CorrelationID, &r.PrevHash, &r.Hash); err != nil {
			return nil, wrap("list audit", err)
		}
		r.Time = timeCol(t)
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list audit", err)
	}
	return recs, nil
}

// auditSeqFrom returns a seq below which no record has a time at or after
// since: the first such record's seq, or one past the last record when
// none has. Record times never go backwards along the chain except where
// the appending clock stepped back, which audit_clock_steps lists; so the
// chain is runs of non-decreasing times, and the first run whose last
// record is at or after since holds the answer, found by a binary search
// on seq. Two statements, each reading about log2(records) + steps rows by
// the primary keys, however long the chain. The chain is append-only, so a
// bound found here holds for any later read of it.
func (s *SQLite) auditSeqFrom(ctx context.Context, since time.Time) (int64, error) {
	// The last record of each run, in seq order: the one before each step,
	// and the head.
	rows, err := s.r.QueryContext(ctx, `
		SELECT r.seq, r.time FROM audit_clock_steps c JOIN audit_records r ON r.seq = c.seq - 1
		UNION ALL
		SELECT seq, time FROM (SELECT seq, time FROM audit_records ORDER BY seq DESC LIMIT 1)
		ORDER BY 1`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	bound := timeArg(since).(int64)
	first, lo, hi := int64(1), int64(0), int64(0)
	for rows.Next() {
		var end, t int64
		if err := rows.Scan(&end, &t); err != nil {
			return 0, err
		}
		if t >= bound {
			lo, hi = first, end
			break
		}
		first = end + 1
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	rows.Close()
	if hi == 0 {
		return first, nil // no record is at or after since
	}
	// Within [lo, hi] times do not decrease and hi's is at or after since:
	// halve the range, keeping the first such record in it.
	var seq int64
	err = s.r.QueryRowContext(ctx, `
		WITH RECURSIVE search (lo, hi) AS (
			VALUES (?1, ?2)
			UNION ALL
			SELECT iif(r.time >= ?3, s.lo, r.seq + 1), iif(r.time >= ?3, r.seq, s.hi)
			FROM search s JOIN audit_records r ON r.seq = (s.lo + s.hi) / 2
			WHERE s.lo < s.hi
		)
		SELECT max(lo) FROM search`, lo, hi, bound).Scan(&seq)
	return seq, err
}

// prefixEnd returns the least string greater than every string that starts
// with prefix, in byte order; false if there is none (all bytes 0xff).
func prefixEnd(prefix string) (string, bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

// InsertAuditCheckpoint stores a checkpoint; ErrConflict on a duplicate Seq.
func (s *SQLite) InsertAuditCheckpoint(ctx context.Context, c store.AuditCheckpoint) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO audit_checkpoints
		(seq, hash, time, key_id, signature) VALUES (?, ?, ?, ?, ?)`,
		c.Seq, c.Hash, timeArg(c.Time), c.KeyID, c.Signature)
	if err != nil {
		return wrap("insert audit checkpoint", err)
	}
	return nil
}

// ListAuditCheckpoints returns every checkpoint in ascending Seq.
func (s *SQLite) ListAuditCheckpoints(ctx context.Context) ([]store.AuditCheckpoint, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT seq, hash, time, key_id, signature
		FROM audit_checkpoints ORDER BY seq`)
	if err != nil {
		return nil, wrap("list audit checkpoints", err)
	}
	defer rows.Close()
	var cs []store.AuditCheckpoint
	for rows.Next() {
		var (
			c store.AuditCheckpoint
			t sql.NullInt64
		)
		if err := rows.Scan(&c.Seq, &c.Hash, &t, &c.KeyID, &c.Signature); err != nil {
			return nil, wrap("list audit checkpoints", err)
		}
		c.Time = timeCol(t)
		cs = append(cs, c)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list audit checkpoints", err)
	}
	return cs, nil
}

// sweepAudited runs a cleaner's statement, which returns the IDs it
// changed, and appends audit(ids)'s record in its write; it appends
// nothing when no row changed. The IDs come sorted. A nil record is
// refused with unaudited, the invariant it would break.
func (s *SQLite) sweepAudited(ctx context.Context, op, query string, args []any, audit func([]string) func(store.AuditHead) (store.AuditRecord, error), unaudited string) ([]string, error) {
	var ids []string
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var err error
		if ids, err = returnedIDs(ctx, tx, op, query, args); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		build := audit(ids)
		if build == nil {
			return fmt.Errorf("sqlite: %s %v: no audit record: %s", op, ids, unaudited)
		}
		return appendAuditOf(ctx, tx, fmt.Sprintf("%s %v", op, ids), build)
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// returnedIDs runs query, whose RETURNING gives one ID a row, and returns
// the IDs sorted.
func returnedIDs(ctx context.Context, tx *writeTx, op, query string, args []any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap(op, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, wrap(op, err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(op, err)
	}
	// RETURNING yields rows in no particular order.
	slices.Sort(ids)
	return ids, nil
}
