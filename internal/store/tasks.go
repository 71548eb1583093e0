package store

import (
	"context"
	"slices"
	"time"
)

// Task delivery states: queued until a stream sends it, delivered until
// the agent answers, then ok, refused or failed.
const (
	TaskQueued    = "queued"
	TaskDelivered = "delivered"
	TaskOK        = "ok"
	TaskRefused   = "refused"
	TaskFailed    = "failed"
)

// Task is one signed task: Signed is the wire form agents verify.
type Task struct {
	ID              string
	Type            string
	SignerVersionID string
	Signed          []byte
	CreatedBy       string
	CreatedAt       time.Time
	ExpiresAt       time.Time
}

// QueuedTask is a task and the nodes it is queued for.
type QueuedTask struct {
	Task    Task
	NodeIDs []string
}

// TaskStore queues signed tasks per node. Safe for concurrent use.
type TaskStore interface {
	// InsertTask stores a task and queues it for each of nodeIDs, in one
	// transaction with its record, as InsertTasks; ErrConflict if its ID
	// exists.
	InsertTask(ctx context.Context, t Task, nodeIDs []string, audit func(head AuditHead) (AuditRecord, error)) error
	// InsertTasks stores several tasks, each queued for its own nodes, in
	// one transaction: all or none (one send split into pages of nodes).
	// audit builds their record (task.send), appended in the same
	// transaction (see Store.AppendAudit): an error building or appending
	// it is returned and nothing is written; a nil audit is refused.
	InsertTasks(ctx context.Context, ts []QueuedTask, audit func(head AuditHead) (AuditRecord, error)) error
	// QueueTaskToAll stores t and queues it for every node, in one
	// transaction: all or none. The nodes are read and queued a page of
	// pageSize at a time, in node ID order (keyset: one statement a page
	// both reads the page and queues it), so they are never all in memory;
	// page is called with each page's node IDs, sorted, before the commit
	// (what it keeps is true only once QueueTaskToAll returns nil).
	// It returns how many nodes were queued; ErrConflict if t's ID exists.
	// audit(n), n the nodes queued, builds the send's record (task.send),
	// appended in the same transaction: an error building or appending it
	// is returned and nothing is written (what page was told is void); a
	// nil audit, or one returning nil, is refused.
	QueueTaskToAll(ctx context.Context, t Task, pageSize int, page func(nodeIDs []string), audit func(n int) func(head AuditHead) (AuditRecord, error)) (int, error)
	// PendingTasks returns the tasks queued or delivered to nodeID and not
	// answered, that have not expired by the store clock, oldest first.
	PendingTasks(ctx context.Context, nodeID string) ([]Task, error)
	// MarkTaskDelivered moves a queued delivery to delivered; ErrConflict
	// if it is not queued (delivered already, or answered).
	MarkTaskDelivered(ctx context.Context, taskID, nodeID string) error
	// RecordTaskResult records the agent's answer (TaskOK, TaskRefused or
	// TaskFailed) of a queued or delivered task; ErrConflict if it was
	// answered already (of two answers, the first stands), ErrNotFound if
	// the task was never queued for nodeID. audit builds the answer's
	// record (task.result), appended in the same transaction: an error
	// building or appending it is returned and the delivery stays
	// unanswered; a nil audit is refused. A refused write (ErrConflict,
	// ErrNotFound) appends nothing.
	RecordTaskResult(ctx context.Context, taskID, nodeID, state, detail string, audit func(head AuditHead) (AuditRecord, error)) error
}

// QueueInPages is the keyset loop of QueueTaskToAll, the same for every
// backend: next queues the page of at most size nodes after a node ID and
// returns their IDs, in any order; page is told each page sorted. It
// returns how many nodes were queued.
func QueueInPages(size int, next func(after string) ([]string, error), page func(nodeIDs []string)) (int, error) {
	total := 0
	for after := ""; ; {
		ids, err := next(after)
		if err != nil || len(ids) == 0 {
			return total, err
		}
		// RETURNING does not promise the SELECT's order.
		slices.Sort(ids)
		page(ids)
		total += len(ids)
		if len(ids) < size {
			return total, nil
		}
		after = ids[len(ids)-1]
	}
}
