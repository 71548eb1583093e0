package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const taskColumns = `t.task_id, t.task_type, t.signer_version_id, t.signed, t.created_by, t.created_at, t.expires_at`

// insertTask stores a task's row (its deliveries apart).
const insertTask = `INSERT INTO tasks (task_id, task_type, signer_version_id, signed, created_by, created_at, expires_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7)`

// InsertTask stores a task and its deliveries in one transaction.
func (s *Store) InsertTask(ctx context.Context, t store.Task, nodeIDs []string) error {
	return s.InsertTasks(ctx, []store.QueuedTask{{Task: t, NodeIDs: nodeIDs}})
}

// InsertTasks stores tasks and their deliveries in one transaction.
func (s *Store) InsertTasks(ctx context.Context, ts []store.QueuedTask) error {
	return s.inTx(ctx, "insert task", func(tx pgx.Tx) error {
		for _, q := range ts {
			t := q.Task
			if _, err := tx.Exec(ctx, insertTask, t.ID, t.Type, t.SignerVersionID, t.Signed, t.CreatedBy, timeArg(t.CreatedAt), timeArg(t.ExpiresAt)); err != nil {
				return wrap("insert task", err)
			}
			// One statement per task, not one per node: a task to a fleet
			// of 100,000 is about a hundred tasks, not 100,000 round trips.
			if _, err := tx.Exec(ctx, `INSERT INTO task_deliveries (task_id, node_id, state, updated_at)
				SELECT $1, node_id, 'queued', `+nowMicros+` FROM unnest($2::text[]) AS n(node_id)`, t.ID, q.NodeIDs); err != nil {
				return wrap("insert task delivery", err)
			}
			if err := notifyTx(ctx, tx, store.ChangeTasks, q.NodeIDs...); err != nil {
				return err
			}
		}
		return nil
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
// that a concurrent answer, once committed, makes match nothing.
func (s *Store) RecordTaskResult(ctx context.Context, taskID, nodeID, state, detail string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE task_deliveries SET state = $1, detail = $2, updated_at = `+nowMicros+`
		WHERE task_id = $3 AND node_id = $4 AND state IN ('queued', 'delivered')`, state, detail, taskID, nodeID)
	if err != nil {
		return wrap("record task result", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var cur string
	err = s.pool.QueryRow(ctx, `SELECT state FROM task_deliveries WHERE task_id = $1 AND node_id = $2`, taskID, nodeID).Scan(&cur)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres: record task result: %s was not sent to %s: %w", taskID, nodeID, store.ErrNotFound)
	} else if err != nil {
		return wrap("record task result", err)
	}
	return fmt.Errorf("postgres: record task result: %s on %s already answered (%s): %w", taskID, nodeID, cur, store.ErrConflict)
}
