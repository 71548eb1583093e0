package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// MissingNodes returns those of ids that name no node, in the order given,
// in one round trip.
func (s *Store) MissingNodes(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT u.id FROM unnest($1::text[]) WITH ORDINALITY AS u(id, n)
		WHERE NOT EXISTS (SELECT 1 FROM nodes WHERE nodes.id = u.id) ORDER BY u.n`, ids)
	if err != nil {
		return nil, wrap("missing nodes", err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, wrap("missing nodes", err)
	}
	return missing, nil
}
