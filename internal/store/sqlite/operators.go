package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// InsertOperator records an issued operator certificate; ErrConflict on a
// duplicate serial or while another certificate of the same name is valid
// at o.CreatedAt, unless o.Reissue. The check and the insert are one
// statement, in one write with the audit record.
func (s *SQLite) InsertOperator(ctx context.Context, o store.Operator, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: insert operator %s: no audit record: an operator is never added unaudited", o.Name)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO operators
			(serial, name, spiffe_id, not_before, not_after, created_by, created_at)
			SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
			WHERE ?8 OR NOT EXISTS (SELECT 1 FROM operators WHERE name = ?2 AND not_after > ?7)`,
			o.Serial, o.Name, o.SPIFFEID,
			timeArg(o.NotBefore), timeArg(o.NotAfter), o.CreatedBy, timeArg(o.CreatedAt), o.Reissue)
		if err != nil {
			return wrap("insert operator", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return wrap("insert operator", err)
		} else if n == 0 {
			return fmt.Errorf("sqlite: insert operator: %w: %s holds a certificate still valid", store.ErrConflict, o.Name)
		}
		return appendAuditOf(ctx, tx, "insert operator "+o.Name, audit)
	})
}

// ListOperators returns every operator certificate, oldest first (ties by
// serial).
func (s *SQLite) ListOperators(ctx context.Context) ([]store.Operator, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT
		serial, name, spiffe_id, not_before, not_after, created_by, created_at
		FROM operators ORDER BY created_at, serial`)
	if err != nil {
		return nil, wrap("list operators", err)
	}
	defer rows.Close()
	var ops []store.Operator
	for rows.Next() {
		var (
			o                            store.Operator
			notBefore, notAfter, created sql.NullInt64
		)
		if err := rows.Scan(&o.Serial, &o.Name, &o.SPIFFEID, &notBefore, &notAfter, &o.CreatedBy, &created); err != nil {
			return nil, wrap("list operators", err)
		}
		o.NotBefore, o.NotAfter, o.CreatedAt = timeCol(notBefore), timeCol(notAfter), timeCol(created)
		ops = append(ops, o)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list operators", err)
	}
	return ops, nil
}

// ReadOperatorStanding returns whether serial is an operator certificate
// of name and the lock in force on name, in one query: the lock is the
// one FindAnyLock returns for {LockAdmin, name}.
func (s *SQLite) ReadOperatorStanding(ctx context.Context, serial, name string) (store.OperatorStanding, error) {
	var (
		st                                  store.OperatorStanding
		id, kind, target, reason, createdBy sql.NullString
		created, expires                    sql.NullInt64
	)
	err := s.r.lookup(ctx, `SELECT
		EXISTS (SELECT 1 FROM operators WHERE serial = ?1 AND name = ?2),
		l.id, l.kind, l.target, l.reason, l.created_by, l.created_at, l.expires_at
		FROM (SELECT 1) LEFT JOIN (SELECT `+lockColumns+` FROM locks
			WHERE kind = ?3 AND target = ?2 AND `+unexpired+`
			ORDER BY created_at, id LIMIT 1) AS l ON 1`,
		serial, name, store.LockAdmin).Scan(&st.Known, &id, &kind, &target, &reason, &createdBy, &created, &expires)
	if err != nil {
		return store.OperatorStanding{}, wrap("read operator standing", err)
	}
	if id.Valid {
		st.Locked = true
		st.Lock = store.Lock{ID: id.String, Kind: kind.String, Target: target.String, Reason: reason.String,
			CreatedBy: createdBy.String, CreatedAt: timeCol(created), ExpiresAt: timeCol(expires)}
	}
	return st, nil
}
