package sqlite

import (
	"context"
	"encoding/json"
)

// MissingNodes returns those of ids that name no node, in the order given.
// The IDs go in as one JSON array, so the statement does not depend on
// their number.
func (s *SQLite) MissingNodes(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	arr, err := json.Marshal(ids)
	if err != nil {
		return nil, wrap("missing nodes", err)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT j.value FROM json_each(?) AS j
		WHERE NOT EXISTS (SELECT 1 FROM nodes WHERE nodes.id = j.value) ORDER BY j.key`, string(arr))
	if err != nil {
		return nil, wrap("missing nodes", err)
	}
	return collect(rows, "missing nodes", func(r scanner) (string, error) {
		var id string
		return id, r.Scan(&id)
	})
}
