package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// InsertOperator records an issued operator certificate; ErrConflict on a
// duplicate serial or while another certificate of the same name is valid
// at o.CreatedAt, unless o.Reissue. The name's advisory lock makes the check and the insert
// one step across replicas.
func (s *Store) InsertOperator(ctx context.Context, o store.Operator) error {
	return s.inTx(ctx, "insert operator", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, operatorLockClass, o.Name); err != nil {
			return wrap("insert operator: lock", err)
		}
		tag, err := tx.Exec(ctx, `INSERT INTO operators
			(serial, name, spiffe_id, not_before, not_after, created_by, created_at)
			SELECT $1, $2, $3, $4, $5, $6, $7
			WHERE $8 OR NOT EXISTS (SELECT 1 FROM operators WHERE name = $2 AND not_after > $7)`,
			o.Serial, o.Name, o.SPIFFEID,
			timeArg(o.NotBefore), timeArg(o.NotAfter), o.CreatedBy, timeArg(o.CreatedAt), o.Reissue)
		if err != nil {
			return wrap("insert operator", err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("postgres: insert operator: %w: %s holds a certificate still valid", store.ErrConflict, o.Name)
		}
		return nil
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
