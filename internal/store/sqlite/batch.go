package sqlite

import (
	"context"
	"fmt"
	"slices"
)

// Group commit. With synchronous=FULL every commit waits for an fsync, and
// on the hot paths (joins, renewals, audit appends) the fsync, not the
// work, is the cost. Writes submitted while a commit is in flight queue up
// and the next transaction runs them all, then commits once: one fsync for
// the whole batch. Each write still succeeds or fails on its own, and no
// caller hears of success before the commit that made its write durable.
//
// The writes of a batch run one after another in the transaction without
// savepoints: a savepoint per write costs two statements and makes SQLite
// copy every page the write touches into the statement journal, and
// nearly every write succeeds. When one fails, the transaction is rolled
// back and run again, the writes before the failed one as before and the
// failed one and those after it each in its own savepoint (SAVEPOINT op …
// RELEASE op, ROLLBACK TO op on failure), so its error is the one it meets
// after the writes that commit ahead of it. A write that fails first in its
// transaction (nothing ran before it) has its answer at once and is not run
// again. So a write's fn may run more than once: it must only touch the
// database through tx and keep nothing from a run but what its last run
// sets (assign results, do not append to them). A write whose fn must run
// once at most (writeAlone) gets a transaction of its own.

// maxBatch bounds a batch so one commit cannot hold the writer for long.
const maxBatch = 64

type writeOp struct {
	ctx context.Context
	fn  func(ctx context.Context, tx *writeTx) error
	// alone keeps the write out of other writes' batches, so its fn runs
	// once at most (see writeAlone).
	alone bool
	err   error
	done  chan error
}

// write runs fn in a write transaction, possibly shared with other writes,
// and returns once that transaction has committed (or fn failed). fn must
// only touch the database through tx, and may be run more than once (see
// above): each run starts from the results of the writes ahead of it, and
// only the last run's writes and results count. It runs with a context
// that is not cancelled midway, as interrupting a statement would roll
// back the whole shared transaction.
func (s *SQLite) write(ctx context.Context, fn func(ctx context.Context, tx *writeTx) error) error {
	return s.submit(&writeOp{ctx: ctx, fn: fn, done: make(chan error, 1)})
}

// writeAlone is write for an fn that must not run twice, as it reports to
// its caller as it goes: it runs in a transaction of its own, once.
func (s *SQLite) writeAlone(ctx context.Context, fn func(ctx context.Context, tx *writeTx) error) error {
	return s.submit(&writeOp{ctx: ctx, fn: fn, alone: true, done: make(chan error, 1)})
}

func (s *SQLite) submit(op *writeOp) error {
	select {
	case s.ops <- op:
	case <-op.ctx.Done():
		return op.ctx.Err()
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
	var held *writeOp // a write to run alone, received while forming a batch
	for {
		first := held
		held = nil
		if first == nil {
			select {
			case first = <-s.ops:
			case <-s.closed:
				return
			}
		}
		batch := []*writeOp{first}
	drain:
		for !first.alone && len(batch) < maxBatch {
			select {
			case op := <-s.ops:
				if op.alone {
					held = op
					break drain
				}
				batch = append(batch, op)
			default:
				break drain
			}
		}
		s.runBatch(batch)
		s.wstmts.preparePending(context.Background())
	}
}

// runBatch runs batch in one transaction (see the comment at the top) and
// answers each write.
func (s *SQLite) runBatch(batch []*writeOp) {
	defer func() {
		for _, op := range batch {
			op.done <- op.err
		}
	}()
	todo := batch // the writes still to be answered by a commit
	// plain is how many of todo run without a savepoint.
	plain := len(todo)
	for {
		failed, final, err := s.runOnce(todo, plain)
		switch {
		case err != nil: // the transaction itself failed
			for _, op := range todo {
				op.err = err
			}
			return
		case failed < 0:
			return // committed
		case final:
			// Nothing ran before it: it fails the same way alone, and
			// keeps that answer (op.err) without running again.
			todo = slices.Delete(slices.Clone(todo), failed, failed+1)
			plain = len(todo)
		default:
			plain = failed
		}
	}
}

// runOnce runs todo in one transaction, the first plain writes without
// savepoints, the others each in its own, and commits; each write's error
// is left in its op.err. If a write without a savepoint fails, runOnce
// rolls back and returns its index, final if no write ran before it in
// the transaction. It returns -1 once committed, and an error if the
// transaction itself failed.
func (s *SQLite) runOnce(todo []*writeOp, plain int) (failed int, final bool, err error) {
	sqlTx, err := s.w.BeginTx(context.Background(), nil)
	if err != nil {
		return 0, false, wrap("begin", err)
	}
	tx := &writeTx{Tx: sqlTx, cache: s.wstmts}
	ran := false
	for i, op := range todo {
		if err := op.ctx.Err(); err != nil {
			op.err = err
			continue
		}
		if i < plain {
			if op.err = op.fn(context.WithoutCancel(op.ctx), tx); op.err != nil {
				tx.Rollback() // may fail if SQLite ended it already; it is over either way
				return i, !ran, nil
			}
			ran = true
			continue
		}
		// Through the writer's statement cache (ExecContext, not the
		// embedded Tx's Exec): statements parsed once rather than per
		// write.
		if _, err := tx.ExecContext(context.Background(), `SAVEPOINT op`); err != nil {
			tx.Rollback()
			return 0, false, wrap("savepoint", err)
		}
		op.err = op.fn(context.WithoutCancel(op.ctx), tx)
		undo := []string{`RELEASE op`}
		if op.err != nil {
			undo = []string{`ROLLBACK TO op`, `RELEASE op`}
		}
		for _, q := range undo {
			if _, err := tx.ExecContext(context.Background(), q); err != nil {
				tx.Rollback()
				return 0, false, wrap("savepoint", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, false, wrap("commit", err)
	}
	return -1, false, nil
}
