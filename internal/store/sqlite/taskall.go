package sqlite

import (
	"context"
	"slices"

	"github.com/muster-dev/muster/internal/store"
)

// queueAllPage queues a task for the next page of nodes after a node ID
// and returns the page: the read and the write are one statement.
const queueAllPage = `INSERT INTO task_deliveries (task_id, node_id, state, updated_at)
	SELECT ?, id, 'queued', ` + nowMicros + ` FROM nodes WHERE id > ? ORDER BY id LIMIT ?
	RETURNING node_id`

// QueueTaskToAll stores a task and queues it for every node, a page at a
// time, in one write transaction.
func (s *SQLite) QueueTaskToAll(ctx context.Context, t store.Task, pageSize int, page func(nodeIDs []string)) (int, error) {
	total := 0
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		total = 0
		if _, err := tx.ExecContext(ctx, `INSERT INTO tasks (task_id, task_type, signer_version_id, signed, created_by, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, t.ID, t.Type, t.SignerVersionID, t.Signed, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.ExpiresAt)); err != nil {
			return wrap("insert task", err)
		}
		ids := make([]string, 0, pageSize)
		for after := ""; ; {
			rows, err := tx.QueryContext(ctx, queueAllPage, t.ID, after, pageSize)
			if err != nil {
				return wrap("queue task to all", err)
			}
			ids = ids[:0]
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return wrap("queue task to all", err)
				}
				ids = append(ids, id)
			}
			if err := rows.Close(); err != nil {
				return wrap("queue task to all", err)
			}
			if err := rows.Err(); err != nil {
				return wrap("queue task to all", err)
			}
			if len(ids) == 0 {
				return nil
			}
			// RETURNING does not promise the SELECT's order.
			slices.Sort(ids)
			page(ids)
			total += len(ids)
			if len(ids) < pageSize {
				return nil
			}
			after = ids[len(ids)-1]
		}
	})
	if err != nil {
		return 0, err
	}
	// Every node: the kind alone.
	s.hub.announce(store.ChangeTasks)
	return total, nil
}
