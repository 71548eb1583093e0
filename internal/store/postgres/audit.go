package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// defaultAuditLimit is the ListAudit page size when the filter sets none.
const defaultAuditLimit = 1000

const auditColumns = `seq, time, actor, action, target, result, reason, source, correlation_id, prev_hash, hash`

// AppendAudit appends one record to the chain, in a transaction of its
// own: BEGIN with the link's baton (and, for a quiet link, the chain's
// lock and head), then the record with COMMIT (chain.go). Whoever inserts
// a record holds pg_advisory_xact_lock(auditLockKey), which every writer
// of the chain in every process takes before it reads the head or inserts
// on a head it guessed, and holds until it commits; under READ COMMITTED
// the statement after the lock sees every append committed before the
// lock was granted. So two transactions can never both insert seq N, and
// the primary key on seq backs that up. The record must have Seq
// head.Seq+1 and PrevHash head.Hash, else ErrConflict and nothing is
// written; an error from build is returned wrapped and nothing is
// written. build may be called on a guessed head and, if the guess
// misses, again on the head read; it must not write to the store.
func (s *Store) AppendAudit(ctx context.Context, build func(head store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error) {
	var rec store.AuditRecord
	err := s.inPipe(ctx, "append audit", func(p *pipe) error {
		var err error
		rec, err = commitAuditRecord(ctx, p, build, "append audit")
		return err
	})
	if err != nil {
		return store.AuditRecord{}, err
	}
	return rec, nil
}

// queueAuditHead queues, at the end of a pipe's batch, the chain's lock
// and the head read: the lock is taken after the other writes of the
// batch, so every writer takes row locks before the chain's lock and none
// waits for a row while holding it.
func queueAuditHead(p *pipe, head *store.AuditHead) {
	p.exec(auditLockQuery, []any{auditLockKey}, wrapped("append audit: lock"))
	p.row(auditHeadQuery, nil, func(row pgx.Row) error {
		switch err := row.Scan(&head.Seq, &head.Hash); {
		case errors.Is(err, pgx.ErrNoRows):
			*head = store.AuditHead{}
		case err != nil:
			return wrap("append audit", err)
		}
		return nil
	})
}

const (
	auditLockQuery   = `SELECT pg_advisory_xact_lock($1)`
	auditHeadQuery   = `SELECT seq, hash FROM audit_records ORDER BY seq DESC LIMIT 1`
	insertAuditQuery = `INSERT INTO audit_records (` + auditColumns + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
)

func auditArgs(rec store.AuditRecord) []any {
	return []any{rec.Seq, timeArg(rec.Time), rec.Actor, rec.Action, rec.Target, rec.Result,
		rec.Reason, rec.Source, rec.CorrelationID, rec.PrevHash, rec.Hash}
}

// AuditHead returns the last record's seq and hash: Seq 0 and a nil Hash
// for an empty chain.
func (s *Store) AuditHead(ctx context.Context) (store.AuditHead, error) {
	h, err := auditHead(ctx, s.pool)
	if err != nil {
		return store.AuditHead{}, wrap("audit head", err)
	}
	return h, nil
}

func auditHead(ctx context.Context, q querier) (store.AuditHead, error) {
	var h store.AuditHead
	err := q.QueryRow(ctx, auditHeadQuery).Scan(&h.Seq, &h.Hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.AuditHead{}, nil
	}
	return h, err
}

// ListAudit returns matching records in ascending Seq. An Action ending in
// '*' matches by prefix, case-sensitively: the action column is COLLATE
// "C", so the lower bound uses its index and starts_with does the rest
// without the escaping LIKE would need.
func (s *Store) ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditRecord, error) {
	var (
		where []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if !f.Since.IsZero() {
		where = append(where, `time >= `+arg(timeArg(f.Since)))
	}
	if prefix, ok := strings.CutSuffix(f.Action, "*"); ok {
		if prefix != "" {
			p := arg(prefix)
			where = append(where, `action >= `+p+` AND starts_with(action, `+p+`)`)
		}
	} else if f.Action != "" {
		where = append(where, `action = `+arg(f.Action))
	}
	if f.AfterSeq > 0 {
		where = append(where, `seq > `+arg(f.AfterSeq))
	}
	limit := f.Limit
	if limit <= 0 {
		limit = defaultAuditLimit
	}
	q := `SELECT ` + auditColumns + ` FROM audit_records`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	q += ` ORDER BY seq LIMIT ` + arg(limit)

	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, wrap("list audit", err)
	}
	return collect(rows, "list audit", func(row pgx.Row) (store.AuditRecord, error) {
		var (
			r store.AuditRecord
			t *int64
		)
		if err := row.Scan(&r.Seq, &t, &r.Actor, &r.Action, &r.Target, &r.Result,
			&r.Reason, &r.Source, &r.CorrelationID, &r.PrevHash, &r.Hash); err != nil {
			return store.AuditRecord{}, err
		}
		r.Time = timeCol(t)
		return r, nil
	})
}

// InsertAuditCheckpoint stores a checkpoint; ErrConflict on a duplicate Seq.
func (s *Store) InsertAuditCheckpoint(ctx context.Context, c store.AuditCheckpoint) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO audit_checkpoints
		(seq, hash, time, key_id, signature) VALUES ($1, $2, $3, $4, $5)`,
		c.Seq, c.Hash, timeArg(c.Time), c.KeyID, c.Signature)
	if err != nil {
		return wrap("insert audit checkpoint", err)
	}
	return nil
}

// ListAuditCheckpoints returns every checkpoint in ascending Seq.
func (s *Store) ListAuditCheckpoints(ctx context.Context) ([]store.AuditCheckpoint, error) {
	rows, err := s.pool.Query(ctx, `SELECT seq, hash, time, key_id, signature
		FROM audit_checkpoints ORDER BY seq`)
	if err != nil {
		return nil, wrap("list audit checkpoints", err)
	}
	return collect(rows, "list audit checkpoints", func(row pgx.Row) (store.AuditCheckpoint, error) {
		var (
			c store.AuditCheckpoint
			t *int64
		)
		if err := row.Scan(&c.Seq, &c.Hash, &t, &c.KeyID, &c.Signature); err != nil {
			return store.AuditCheckpoint{}, err
		}
		c.Time = timeCol(t)
		return c, nil
	})
}
