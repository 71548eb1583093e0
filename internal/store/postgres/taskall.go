package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// queueAllPage queues a task for the next page of nodes after a node ID
// and returns the page's IDs in one row: the read and the write are one
// statement, one round trip a page.
const queueAllPage = `WITH queued AS (INSERT INTO task_deliveries (task_id, node_id, state, updated_at)
	SELECT $1, id, 'queued', ` + nowMicros + ` FROM nodes WHERE id > $2 ORDER BY id LIMIT $3
	RETURNING node_id)
	SELECT coalesce(array_agg(node_id), '{}') FROM queued`

// QueueTaskToAll stores a task and queues it for every node, a page at a
// time, and the send's audit record, built for the count queued, in one
// transaction (a pipe: the task's row goes with the first page). Under
// READ COMMITTED each page sees the nodes committed before it: a node
// that joins during the send may be missed, as it would be by a send that
// read the nodes first.
func (s *Store) QueueTaskToAll(ctx context.Context, t store.Task, pageSize int, page func(nodeIDs []string), audit func(n int) func(store.AuditHead) (store.AuditRecord, error)) (int, error) {
	if audit == nil {
		return 0, fmt.Errorf("postgres: queue task %s to all: no audit record: a task is never sent unaudited", t.ID)
	}
	const op = "queue task to all"
	total := 0
	err := s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(insertTask, []any{t.ID, t.Type, t.SignerVersionID, t.Signed, t.CreatedBy,
			timeArg(t.CreatedAt), timeArg(t.ExpiresAt)}, wrapped("insert task"))
		var err error
		total, err = store.QueueInPages(pageSize, func(after string) ([]string, error) {
			var ids []string
			p.row(queueAllPage, []any{t.ID, after, pageSize}, func(row pgx.Row) error {
				if err := row.Scan(&ids); err != nil {
					return wrap(op, err)
				}
				return nil
			})
			if err := p.send(ctx); err != nil {
				return nil, err
			}
			return ids, nil
		}, page)
		if err != nil {
			return err
		}
		build := audit(total)
		if build == nil {
			return fmt.Errorf("postgres: queue task %s to all: no audit record: a task is never sent unaudited", t.ID)
		}
		// Every node: the kind alone, delivered on commit.
		queueNotify(p, store.ChangeTasks)
		return commitAudited(ctx, p, build, op+" "+t.ID)
	})
	if err != nil {
		return 0, err
	}
	return total, nil
}
