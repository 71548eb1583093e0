package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// InsertOperator records an issued operator certificate; ErrConflict on a
// duplicate serial.
func (s *Store) InsertOperator(ctx context.Context, o store.Operator) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO operators
		(serial, name, spiffe_id, not_before, not_after, created_by, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		o.Serial, o.Name, o.SPIFFEID,
		timeArg(o.NotBefore), timeArg(o.NotAfter), o.CreatedBy, timeArg(o.CreatedAt))
	if err != nil {
		return wrap("insert operator", err)
	}
	return nil
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
