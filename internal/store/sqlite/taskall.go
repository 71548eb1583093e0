package sqlite

import (
	"context"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// queueAllPage queues a task for the next page of nodes after a node ID
// and returns the page: the read and the write are one statement.
const queueAllPage = `INSERT INTO task_deliveries (task_id, node_id, state, updated_at)
	SELECT ?, id, 'queued', ` + nowMicros + ` FROM nodes WHERE id > ? ORDER BY id LIMIT ?
	RETURNING node_id`

// QueueTaskToAll stores a task and queues it for every node, a page at a
// time, in one write transaction. The transaction is its own (writeAlone):
// page tells the caller of each page as it is queued, so the write must
// not be run again. The send's audit record, built for the count queued,
// is appended in the same transaction.
func (s *SQLite) QueueTaskToAll(ctx context.Context, t store.Task, pageSize int, page func(nodeIDs []string), audit func(n int) func(store.AuditHead) (store.AuditRecord, error)) (int, error) {
	if audit == nil {
		return 0, fmt.Errorf("sqlite: queue task %s to all: no audit record: a task is never sent unaudited", t.ID)
	}
	total := 0
	err := s.writeAlone(ctx, func(ctx context.Context, tx *writeTx) error {
		if _, err := tx.ExecContext(ctx, insertTask, t.ID, t.Type, t.SignerVersionID, t.Signed, t.CreatedBy,
			timeArg(t.CreatedAt), timeArg(t.ExpiresAt)); err != nil {
			return wrap("insert task", err)
		}
		var err error
		total, err = store.QueueInPages(pageSize, func(after string) ([]string, error) {
			rows, err := tx.QueryContext(ctx, queueAllPage, t.ID, after, pageSize)
			if err != nil {
				return nil, wrap("queue task to all", err)
			}
			return collect(rows, "queue task to all", func(r scanner) (id string, err error) { return id, r.Scan(&id) })
		}, page)
		if err != nil {
			return err
		}
		build := audit(total)
		if build == nil {
			return fmt.Errorf("sqlite: queue task %s to all: no audit record: a task is never sent unaudited", t.ID)
		}
		return appendAuditOf(ctx, tx, fmt.Sprintf("queue task %s to all", t.ID), build)
	})
	if err != nil {
		return 0, err
	}
	// Every node: the kind alone.
	s.hub.announce(store.ChangeTasks)
	return total, nil
}
