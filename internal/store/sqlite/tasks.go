package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

const taskColumns = `t.task_id, t.task_type, t.signer_version_id, t.signed, t.created_by, t.created_at, t.expires_at`

// insertTask stores a task's row (its deliveries apart).
const insertTask = `INSERT INTO tasks (task_id, task_type, signer_version_id, signed, created_by, created_at, expires_at)
	VALUES (?, ?, ?, ?, ?, ?, ?)`

// InsertTask stores a task and its deliveries in one write transaction,
// with its audit record.
func (s *SQLite) InsertTask(ctx context.Context, t store.Task, nodeIDs []string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	return s.InsertTasks(ctx, []store.QueuedTask{{Task: t, NodeIDs: nodeIDs}}, audit)
}

// InsertTasks stores tasks and their deliveries in one write transaction,
// with their audit record.
func (s *SQLite) InsertTasks(ctx context.Context, ts []store.QueuedTask, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: insert task: no audit record: a task is never sent unaudited")
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		for _, q := range ts {
			t := q.Task
			if _, err := tx.ExecContext(ctx, insertTask, t.ID, t.Type, t.SignerVersionID, t.Signed, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.ExpiresAt)); err != nil {
				return wrap("insert task", err)
			}
			for _, n := range q.NodeIDs {
				if _, err := tx.ExecContext(ctx, `INSERT INTO task_deliveries (task_id, node_id, state, updated_at)
					VALUES (?, ?, 'queued', `+nowMicros+`)`, t.ID, n); err != nil {
					return wrap("insert task delivery", err)
				}
			}
		}
		return appendAuditOf(ctx, tx, "insert task", audit)
	})
	if err == nil {
		for _, q := range ts {
			s.hub.announce(store.ChangeTasks, q.NodeIDs...)
		}
	}
	return err
}

// PendingTasks returns the unanswered, unexpired tasks of a node.
func (s *SQLite) PendingTasks(ctx context.Context, nodeID string) ([]store.Task, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+taskColumns+` FROM task_deliveries d JOIN tasks t ON t.task_id = d.task_id
		WHERE d.node_id = ? AND d.state IN ('queued', 'delivered') AND t.expires_at > `+nowMicros+`
		ORDER BY t.created_at, t.task_id`, nodeID)
	if err != nil {
		return nil, wrap("pending tasks", err)
	}
	defer rows.Close()
	var out []store.Task
	for rows.Next() {
		var (
			t                store.Task
			created, expires sql.NullInt64
		)
		if err := rows.Scan(&t.ID, &t.Type, &t.SignerVersionID, &t.Signed, &t.CreatedBy, &created, &expires); err != nil {
			return nil, wrap("pending tasks", err)
		}
		t.CreatedAt, t.ExpiresAt = timeCol(created), timeCol(expires)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("pending tasks", err)
	}
	return out, nil
}

// MarkTaskDelivered moves a queued delivery to delivered.
func (s *SQLite) MarkTaskDelivered(ctx context.Context, taskID, nodeID string) error {
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `UPDATE task_deliveries SET state = 'delivered', updated_at = `+nowMicros+`
			WHERE task_id = ? AND node_id = ? AND state = 'queued'`, taskID, nodeID)
		if err != nil {
			return wrap("mark task delivered", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("sqlite: mark task delivered: %s to %s is not queued: %w", taskID, nodeID, store.ErrConflict)
		}
		return nil
	})
}

// RecordTaskResult records an agent's answer once, with its audit record.
func (s *SQLite) RecordTaskResult(ctx context.Context, taskID, nodeID, state, detail string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: record task result: no audit record: an answer is never recorded unaudited")
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `UPDATE task_deliveries SET state = ?, detail = ?, updated_at = `+nowMicros+`
			WHERE task_id = ? AND node_id = ? AND state IN ('queued', 'delivered')`, state, detail, taskID, nodeID)
		if err != nil {
			return wrap("record task result", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return appendAuditOf(ctx, tx, fmt.Sprintf("record task result %s on %s", taskID, nodeID), audit)
		}
		var cur string
		err = tx.QueryRowContext(ctx, `SELECT state FROM task_deliveries WHERE task_id = ? AND node_id = ?`, taskID, nodeID).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("sqlite: record task result: %s was not sent to %s: %w", taskID, nodeID, store.ErrNotFound)
		} else if err != nil {
			return wrap("record task result", err)
		}
		return fmt.Errorf("sqlite: record task result: %s on %s already answered (%s): %w", taskID, nodeID, cur, store.ErrConflict)
	})
}
