package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

const taskColumns = `t.task_id, t.task_type, t.signer_version_id, t.signed, t.created_by, t.created_at, t.expires_at`

// insertTask stores a task's row (its deliveries apart).
const insertTask = `INSERT INTO tasks (task_id, task_type, signer_version_id, signed, created_by, created_at, expires_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7)`

// InsertTask stores a task and its deliveries in one transaction, with its
// audit record.
func (s *Store) InsertTask(ctx context.Context, t store.Task, nodeIDs []string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	return s.InsertTasks(ctx, []store.QueuedTask{{Task: t, NodeIDs: nodeIDs}}, audit)
}

// InsertTasks stores tasks and their deliveries in one transaction, and
// their audit record: one pipe, the rows and the link's baton in the first
// batch, the record with COMMIT in the second (as InsertLock).
func (s *Store) InsertTasks(ctx context.Context, ts []store.QueuedTask, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: insert task: no audit record: a task is never sent unaudited")
	}
	const op = "insert task"
	return s.inPipe(ctx, op, func(p *pipe) error {
		for _, q := range ts {
			t := q.Task
			p.exec(insertTask, []any{t.ID, t.Type, t.SignerVersionID, t.Signed, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.ExpiresAt)}, wrapped(op))
			// One statement per task, not one per node: a task to a fleet
			// of 100,000 is about a hundred tasks, not 100,000 statements.
			p.exec(`INSERT INTO task_deliveries (task_id, node_id, state, updated_at)
				SELECT $1, node_id, 'queued', `+nowMicros+` FROM unnest($2::text[]) AS n(node_id)`, []any{t.ID, q.NodeIDs}, wrapped("insert task delivery"))
			queueNotify(p, store.ChangeTasks, q.NodeIDs...)
		}
		return commitAudited(ctx, p, audit, op)
	})
}

// PendingTasks returns the unanswered, unexpired tasks of a node.
func (s *Store) PendingTasks(ctx context.Context, nodeID string) ([]store.Task, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+taskColumns+` FROM task_deliveries d JOIN tasks t ON t.task_id = d.task_id
		WHERE d.node_id = $1 AND d.state IN ('queued', 'delivered') AND t.expires_at > `+nowMicros+`
		ORDER BY t.created_at, t.task_id`, nodeID)
	if err != nil {
		return nil, wrap("pending tasks", err)
	}
	return collect(rows, "pending tasks", func(row pgx.Row) (store.Task, error) {
		var (
			t                store.Task
			created, expires *int64
		)
		err := row.Scan(&t.ID, &t.Type, &t.SignerVersionID, &t.Signed, &t.CreatedBy, &created, &expires)
		t.CreatedAt, t.ExpiresAt = timeCol(created), timeCol(expires)
		return t, err
	})
}

// MarkTaskDelivered moves a queued delivery to delivered: one conditional
// UPDATE.
func (s *Store) MarkTaskDelivered(ctx context.Context, taskID, nodeID string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE task_deliveries SET state = 'delivered', updated_at = `+nowMicros+`
		WHERE task_id = $1 AND node_id = $2 AND state = 'queued'`, taskID, nodeID)
	if err != nil {
		return wrap("mark task delivered", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("postgres: mark task delivered: %s to %s is not queued: %w", taskID, nodeID, store.ErrConflict)
	}
	return nil
}

// RecordTaskResult records an agent's answer once: a conditional UPDATE
// that a concurrent answer, once committed, makes match nothing, and its
// audit record, in one pipe. A lost write says why from the row as
// committed after the rollback (pipe.explain).
func (s *Store) RecordTaskResult(ctx context.Context, taskID, nodeID, state, detail string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: record task result: no audit record: an answer is never recorded unaudited")
	}
	const op = "record task result"
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`UPDATE task_deliveries SET state = $1, detail = $2, updated_at = `+nowMicros+`
			WHERE task_id = $3 AND node_id = $4 AND state IN ('queued', 'delivered')`, []any{state, detail, taskID, nodeID},
			func(tag pgconn.CommandTag, err error) error {
				if err != nil {
					return wrap(op, err)
				}
				if tag.RowsAffected() != 1 {
					return taskNotAnswered(taskID, nodeID)
				}
				return nil
			})
		return p.explain(ctx, op, commitAudited(ctx, p, audit, op))
	})
}

// taskNotAnswered says why an answer was not recorded: the task was never
// queued for the node (ErrNotFound), or was answered (ErrConflict).
func taskNotAnswered(taskID, nodeID string) *lostWrite {
	return &lostWrite{why: statement{
		sql:  `SELECT state FROM task_deliveries WHERE task_id = $1 AND node_id = $2`,
		args: []any{taskID, nodeID},
		read: func(row pgx.Row) error {
			var cur string
			switch err := row.Scan(&cur); {
			case errors.Is(err, pgx.ErrNoRows):
				return fmt.Errorf("postgres: record task result: %s was not sent to %s: %w", taskID, nodeID, store.ErrNotFound)
			case err != nil:
				return wrap("record task result", err)
			}
			return fmt.Errorf("postgres: record task result: %s on %s already answered (%s): %w", taskID, nodeID, cur, store.ErrConflict)
		},
	}}
}
