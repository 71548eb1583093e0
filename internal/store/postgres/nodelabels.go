package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// NodesWithLabels selects the nodes whose join token's labels contain the
// selector (JSONB containment), in one round trip.
func (s *Store) NodesWithLabels(ctx context.Context, labels map[string]string) ([]string, error) {
	if labels == nil {
		labels = map[string]string{}
	}
	rows, err := s.pool.Query(ctx, `SELECT n.id FROM nodes n JOIN tokens t ON t.id = n.token_id
		WHERE t.labels @> $1::jsonb ORDER BY n.id`, labels)
	if err != nil {
		return nil, wrap("nodes with labels", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, wrap("nodes with labels", err)
	}
	return ids, nil
}
