package sqlite

import (
	"context"
	"encoding/json"
)

// NodesWithLabels selects the nodes whose join token carries every label:
// no wanted pair may be missing from the token's labels. The selector goes
// in as one JSON object, so the statement does not depend on its size.
func (s *SQLite) NodesWithLabels(ctx context.Context, labels map[string]string) ([]string, error) {
	want, err := json.Marshal(labels)
	if err != nil {
		return nil, wrap("nodes with labels", err)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT n.id FROM nodes n JOIN tokens t ON t.id = n.token_id
		WHERE NOT EXISTS (SELECT 1 FROM json_each(?) AS w
			WHERE NOT EXISTS (SELECT 1 FROM json_each(t.labels) AS h WHERE h.key = w.key AND h.value = w.value))
		ORDER BY n.id`, string(want))
	if err != nil {
		return nil, wrap("nodes with labels", err)
	}
	return collect(rows, "nodes with labels", func(r scanner) (string, error) {
		var id string
		return id, r.Scan(&id)
	})
}
