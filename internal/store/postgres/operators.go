package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// InsertOperator records an issued operator certificate; ErrConflict on a
// duplicate serial or while another certificate of the same name is valid
// at o.CreatedAt, unless o.Reissue. The name's advisory lock makes the check and the insert
// one step across replicas; the audit record goes in the same transaction
// (commitAudited).
func (s *Store) InsertOperator(ctx context.Context, o store.Operator, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: insert operator %s: no audit record: an operator is never added unaudited", o.Name)
	}
	op := "insert operator " + o.Name
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, []any{operatorLockClass, o.Name}, wrapped("insert operator: lock"))
		p.exec(`INSERT INTO operators
			(serial, name, spiffe_id, not_before, not_after, created_by, created_at)
			SELECT $1, $2, $3, $4, $5, $6, $7
			WHERE $8 OR NOT EXISTS (SELECT 1 FROM operators WHERE name = $2 AND not_after > $7)`,
			[]any{o.Serial, o.Name, o.SPIFFEID, timeArg(o.NotBefore), timeArg(o.NotAfter), o.CreatedBy, timeArg(o.CreatedAt), o.Reissue},
			func(tag pgconn.CommandTag, err error) error {
				if err != nil {
					return wrap("insert operator", err)
				}
				if tag.RowsAffected() == 0 {
					return fmt.Errorf("postgres: insert operator: %w: %s holds a certificate still valid", store.ErrConflict, o.Name)
				}
				return nil
			})
		return commitAudited(ctx, p, audit, op)
	})
}

// ListOperators returns every operator certificate, oldest first (ties by
// serial).
func (s *Store) ListOperators(ctx context.Context) ([]store.Operator, error) {
	rows, err := s.pool.Query(ctx, `SELECT
		serial, name, spiffe_id, not_before, not_after, created_by, created_at
		FROM operators ORDER BY created_at, serial`)
	if err != nil {
		return nil, wrap("list operators", err)
	}
	return collect(rows, "list operators", func(row pgx.Row) (store.Operator, error) {
		var (
			o                            store.Operator
			notBefore, notAfter, created *int64
		)
		if err := row.Scan(&o.Serial, &o.Name, &o.SPIFFEID, &notBefore, &notAfter, &o.CreatedBy, &created); err != nil {
			return store.Operator{}, err
		}
		o.NotBefore, o.NotAfter, o.CreatedAt = timeCol(notBefore), timeCol(notAfter), timeCol(created)
		return o, nil
	})
}

// ReadOperatorStanding returns whether serial is an operator certificate
// of name and the lock in force on name, in one query: the lock is the
// one FindAnyLock returns for {LockAdmin, name}.
func (s *Store) ReadOperatorStanding(ctx context.Context, serial, name string) (store.OperatorStanding, error) {
	var (
		st                                  store.OperatorStanding
		id, kind, target, reason, createdBy *string
		created, expires                    *int64
	)
	err := s.pool.QueryRow(ctx, `SELECT
		EXISTS (SELECT 1 FROM operators WHERE serial = $1 AND name = $2),
		l.id, l.kind, l.target, l.reason, l.created_by, l.created_at, l.expires_at
		FROM (SELECT 1) AS one LEFT JOIN (SELECT `+lockColumns+` FROM locks
			WHERE kind = $3 AND target = $2 AND `+unexpired+`
			ORDER BY created_at, id LIMIT 1) AS l ON true`,
		serial, name, store.LockAdmin).Scan(&st.Known, &id, &kind, &target, &reason, &createdBy, &created, &expires)
	if err != nil {
		return store.OperatorStanding{}, wrap("read operator standing", err)
	}
	if id != nil {
		st.Locked = true
		st.Lock = store.Lock{ID: *id, Kind: deref(kind), Target: deref(target), Reason: deref(reason),
			CreatedBy: deref(createdBy), CreatedAt: timeCol(created), ExpiresAt: timeCol(expires)}
	}
	return st, nil
}
