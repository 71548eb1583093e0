package sqlite

import (
	"context"
	"fmt"
)

// Group commit. With synchronous=FULL every commit waits for an fsync, and
// on the hot paths (joins, renewals, audit appends) the fsync, not the
// work, is the cost. Writes submitted while a commit is in flight queue up
// and the next transaction runs them all, each inside its own savepoint,
// then commits once: one fsync for the whole batch. Each write still
// succeeds or fails on its own — a failed one is rolled back to its
// savepoint and the others go on — and no caller hears of success before
// the commit that made its write durable.

// maxBatch bounds a batch so one commit cannot hold the writer for long.
const maxBatch = 64

type writeOp struct {
	ctx  context.Context
	fn   func(ctx context.Context, tx *writeTx) error
	err  error
	done chan error
}

// write runs fn in a write transaction, possibly shared with other writes,
// and returns once that transaction has committed (or fn failed). fn must
// only touch the database through tx; it runs with a context that is not
// cancelled midway, as interrupting a statement would roll back the whole
// shared transaction.
func (s *SQLite) write(ctx context.Context, fn func(ctx context.Context, tx *writeTx) error) error {
	op := &writeOp{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.ops <- op:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closed:
		return fmt.Errorf("sqlite: store is closed")
	}
	// Once queued the outcome must be awaited: returning early could
	// report a failure for a write that then commits.
	return <-op.done
}

// committer runs batches until the store closes.
func (s *SQLite) committer() {
	defer close(s.committerDone)
	for {
		var first *writeOp
		select {
		case first = <-s.ops:
		case <-s.closed:
			return
		}
		batch := []*writeOp{first}
	drain:
		for len(batch) < maxBatch {
			select {
			case op := <-s.ops:
				batch = append(batch, op)
			default:
				break drain
			}
		}
		s.runBatch(batch)
		s.wstmts.preparePending(context.Background())
	}
}

func (s *SQLite) runBatch(batch []*writeOp) {
	fail := func(err error) {
		for _, op := range batch {
			op.done <- err
		}
	}
	sqlTx, err := s.w.BeginTx(context.Background(), nil)
	if err != nil {
		fail(wrap("begin", err))
		return
	}
	tx := &writeTx{Tx: sqlTx, cache: s.wstmts}
	for _, op := range batch {
		if err := op.ctx.Err(); err != nil {
			op.err = err
			continue
		}
		// Through the writer's statement cache (ExecContext, not the
		// embedded Tx's Exec): two statements every write runs, parsed
		// once rather than per write.
		if _, err := tx.ExecContext(context.Background(), `SAVEPOINT op`); err != nil {
			tx.Rollback()
			fail(wrap("savepoint", err))
			return
		}
		op.err = op.fn(context.WithoutCancel(op.ctx), tx)
		undo := []string{`RELEASE op`}
		if op.err != nil {
			undo = []string{`ROLLBACK TO op`, `RELEASE op`}
		}
		for _, q := range undo {
			if _, err := tx.ExecContext(context.Background(), q); err != nil {
				tx.Rollback()
				fail(wrap("savepoint", err))
				return
			}
		}
	}
	if err := tx.Commit(); err != nil {
		fail(wrap("commit", err))
		return
	}
	for _, op := range batch {
		op.done <- op.err
	}
}
