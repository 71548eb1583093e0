package postgres

import (
	"context"

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
		if _, err := tx.Exec(ctx, insertTask, t.ID, t.Type, t.SignerVersionID, t.Signed, t.CreatedBy,
			timeArg(t.CreatedAt), timeArg(t.ExpiresAt)); err != nil {
			return wrap("insert task", err)
		}
		var err error
		total, err = store.QueueInPages(pageSize, func(after string) ([]string, error) {
			rows, err := tx.Query(ctx, queueAllPage, t.ID, after, pageSize)
			if err != nil {
				return nil, wrap("queue task to all", err)
			}
			return collect(rows, "queue task to all", func(r pgx.Row) (id string, err error) { return id, r.Scan(&id) })
		}, page)
		if err != nil {
			return err
		}
		// Every node: the kind alone, delivered on commit.
		return notifyTx(ctx, tx, store.ChangeTasks)
	})
	if err != nil {
		return 0, err
	}
	return total, nil
}
