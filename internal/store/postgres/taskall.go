package postgres

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// queueAllPage queues a task for the next page of nodes after a node ID
// and returns the page: the read and the write are one statement, one
// round trip a page.
const queueAllPage = `INSERT INTO task_deliveries (task_id, node_id, state, updated_at)
	SELECT $1, id, 'queued', ` + nowMicros + ` FROM nodes WHERE id > $2 ORDER BY id LIMIT $3
	RETURNING node_id`

// QueueTaskToAll stores a task and queues it for every node, a page at a
// time, in one transaction. Under READ COMMITTED each page sees the nodes
// committed before it: a node that joins during the send may be missed,
// as it would be by a send that read the nodes first.
func (s *Store) QueueTaskToAll(ctx context.Context, t store.Task, pageSize int, page func(nodeIDs []string)) (int, error) {
	total := 0
	err := s.inTx(ctx, "queue task to all", func(tx pgx.Tx) error {
		total = 0
		if _, err := tx.Exec(ctx, `INSERT INTO tasks (task_id, task_type, signer_version_id, signed, created_by, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, t.ID, t.Type, t.SignerVersionID, t.Signed, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.ExpiresAt)); err != nil {
			return wrap("insert task", err)
		}
		ids := make([]string, 0, pageSize)
		for after := ""; ; {
			rows, err := tx.Query(ctx, queueAllPage, t.ID, after, pageSize)
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
			rows.Close()
			if err := rows.Err(); err != nil {
				return wrap("queue task to all", err)
			}
			if len(ids) == 0 {
				break
			}
			// RETURNING does not promise the SELECT's order.
			slices.Sort(ids)
			page(ids)
			total += len(ids)
			if len(ids) < pageSize {
				break
			}
			after = ids[len(ids)-1]
		}
		// Every node: the kind alone, delivered on commit.
		return notifyTx(ctx, tx, store.ChangeTasks)
	})
	if err != nil {
		return 0, err
	}
	return total, nil
}
