package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/muster-dev/muster/internal/store"
)

// defaultAuditLimit is the ListAudit page size when the filter sets none.
const defaultAuditLimit = 1000

const auditColumns = `seq, time, actor, action, target, result, reason, source, correlation_id, prev_hash, hash`

// AppendAudit appends one record to the chain. The read of the head, the
// call to build and the insert run as one write of a group-committed
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

// appendAudit is AppendAudit's work inside the write transaction.
func appendAudit(ctx context.Context, tx *writeTx, build func(head store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error) {
	head, err := auditHead(ctx, tx)
	if err != nil {
		return store.AuditRecord{}, wrap("append audit", err)
	}
	rec, err := store.BuildAuditRecord(head, build)
	if err != nil {
		return store.AuditRecord{}, fmt.Errorf("sqlite: append audit: %w", err)
	}

	if _, err := tx.ExecContext(ctx, `INSERT INTO audit_records (`+auditColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		rec.Seq, timeArg(rec.Time), rec.Actor, rec.Action, rec.Target, rec.Result,
		rec.Reason, rec.Source, rec.CorrelationID, rec.PrevHash, rec.Hash); err != nil {
		return store.AuditRecord{}, wrap("append audit", err)
	}
	return rec, nil
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
	var h store.AuditHead
	err := q.QueryRowContext(ctx, `SELECT seq, hash FROM audit_records ORDER BY seq DESC LIMIT 1`).Scan(&h.Seq, &h.Hash)
	if errors.Is(err, sql.ErrNoRows) {
		return store.AuditHead{}, nil
	}
	return h, err
}

// ListAudit returns matching records in ascending Seq. An Action ending in
// '*' matches by byte prefix, case-sensitively.
func (s *SQLite) ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditRecord, error) {
	var (
		where []string
		args  []any
	)
	if !f.Since.IsZero() {
		where = append(where, `time >= ?`)
		args = append(args, timeArg(f.Since))
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
	if f.AfterSeq > 0 {
		where = append(where, `seq > ?`)
		args = append(args, f.AfterSeq)
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
