package sqlite

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
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

// The writes are queued, in order, in the store's queue. The caller that
// finds no batch running leads: it takes a batch from the front of the
// queue (its own write first), runs it, answers each write of it, and
// hands the writer to the caller of the first write still queued, which
// leads the next batch in its own goroutine. So a write alone costs no
// hand-off to another goroutine and back, and under load one wake per
// batch passes the lead on (a goroutine of its own that ran every batch
// cost two per write: one to take the write, one to answer it). A queued
// write whose caller's context ends before a leader takes it leaves the
// queue and hears the context's error; once taken, its answer is awaited.

// maxBatch bounds a batch so one commit cannot hold the writer for long.
const maxBatch = 64

// errLead, sent on a queued write's done channel, tells its caller to lead
// the next batch. It is never returned.
var errLead = errors.New("sqlite: lead the next batch")

// errWritePanicked is a write's answer when its fn panicked; its caller
// then panics again with a *writePanic.
var errWritePanicked = errors.New("sqlite: the write panicked")

// writePanic is what a write's caller panics with when its fn panicked:
// the value fn panicked with and the stack where it did. fn may have run
// in another caller's goroutine (the batch's leader), and even in the
// caller's own the panic is recovered and raised again, so the stack of
// the caller's panic does not show where fn panicked; its message does
// (the runtime prints an error's message for an unrecovered panic, and
// the authority logs a recovered one's).
type writePanic struct {
	value any
	stack []byte
}

func (p *writePanic) Error() string {
	return fmt.Sprintf("%v\n\nsqlite: where the store write's fn panicked:\n%s", p.value, p.stack)
}

// Unwrap returns the value fn panicked with if it is an error.
func (p *writePanic) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

type writeOp struct {
	ctx context.Context
	fn  func(ctx context.Context, tx *writeTx) error
	// alone keeps the write out of other writes' batches, so its fn runs
	// once at most (see writeAlone).
	alone bool
	err   error
	// panicked is what fn's last run panicked with, if it did.
	panicked *writePanic
	// lead is set, under writeMu, when the write's caller is chosen to lead
	// the next batch: it stays in the queue until that batch takes it.
	lead bool
	done chan error
}

// write runs fn in a write transaction, possibly shared with other writes,
// and returns once that transaction has committed (or fn failed). fn must
// only touch the database through tx, and may be run more than once (see
// above): each run starts from the results of the writes ahead of it, and
// only the last run's writes and results count. It runs with a context
// that is not cancelled midway, as interrupting a statement would roll
// back the whole shared transaction. It may run in another caller's
// goroutine; if it panics, write panics with a *writePanic holding the
// value and the stack where fn panicked.
func (s *SQLite) write(ctx context.Context, fn func(ctx context.Context, tx *writeTx) error) error {
	return s.submit(&writeOp{ctx: ctx, fn: fn, done: make(chan error, 1)})
}

// writeAlone is write for an fn that must not run twice, as it reports to
// its caller as it goes: it runs in a transaction of its own, once.
func (s *SQLite) writeAlone(ctx context.Context, fn func(ctx context.Context, tx *writeTx) error) error {
	return s.submit(&writeOp{ctx: ctx, fn: fn, alone: true, done: make(chan error, 1)})
}

func (s *SQLite) submit(op *writeOp) error {
	if err := op.ctx.Err(); err != nil {
		return err
	}
	s.writeMu.Lock()
	if s.writeClosed {
		s.writeMu.Unlock()
		return errClosed
	}
	s.queue = append(s.queue, op)
	leader := !s.leading
	s.leading = true
	s.writeMu.Unlock()
	if !leader {
		if err := s.follow(op); err != errLead {
			return op.answer(err)
		}
	}
	s.lead()
	return op.answer(<-op.done) // lead answered it: it runs first in its batch
}

// answer returns a write's answer err to its caller, panicking again if its
// fn panicked (with a *writePanic, which carries fn's stack).
func (op *writeOp) answer(err error) error {
	if op.panicked != nil {
		panic(op.panicked)
	}
	return err
}

var errClosed = errors.New("sqlite: store is closed")

// follow waits for a queued write's answer, or for errLead. If the caller's
// context ends while the write is still queued and not chosen to lead, it
// leaves the queue.
func (s *SQLite) follow(op *writeOp) error {
	select {
	case err := <-op.done:
		return err
	case <-op.ctx.Done():
	}
	s.writeMu.Lock()
	if i := slices.Index(s.queue, op); i >= 0 && !op.lead {
		s.queue = slices.Delete(s.queue, i, i+1)
		s.writeMu.Unlock()
		return op.ctx.Err()
	}
	s.writeMu.Unlock()
	// Taken into a batch, or chosen to lead: the outcome must be awaited,
	// as returning early could report a failure for a write that then
	// commits.
	return <-op.done
}

// lead runs one batch from the front of the queue, then hands the writer
// on. Its caller leads: it found no batch running, or was chosen.
func (s *SQLite) lead() {
	s.writeMu.Lock()
	if s.writeClosed {
		s.failQueued()
		s.writeMu.Unlock()
		return
	}
	n := 1
	for !s.queue[0].alone && n < min(len(s.queue), maxBatch) && !s.queue[n].alone {
		n++
	}
	batch := append(s.batch[:0], s.queue[:n]...)
	rest := copy(s.queue, s.queue[n:])
	clear(s.queue[rest:])
	s.queue = s.queue[:rest]
	s.writeMu.Unlock()

	defer s.handOver() // even if the batch panics, so the writer is not lost
	s.runBatch(batch)
	clear(batch)
	s.batch = batch
	s.wstmts.preparePending(context.Background())
}

// handOver ends a leader's batch: the caller of the first write queued
// leads the next; with none queued, the writer is idle.
func (s *SQLite) handOver() {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if len(s.queue) > 0 { // if the store is closing, the next leader fails them
		next := s.queue[0]
		next.lead = true
		next.done <- errLead
		return
	}
	s.leading = false
	s.writeIdle.Broadcast()
}

// failQueued answers every queued write that the store is closed, and
// leaves the writer idle for Close. It is called with writeMu held, by
// a leader that found the store closing.
func (s *SQLite) failQueued() {
	for _, op := range s.queue {
		op.done <- errClosed
	}
	clear(s.queue)
	s.queue = s.queue[:0]
	s.leading = false
	s.writeIdle.Broadcast()
}

// runBatch runs batch in one transaction (see the comment at the top) and
// answers each write.
func (s *SQLite) runBatch(batch []*writeOp) {
	returned := false
	defer func() {
		r := recover()
		if r != nil || !returned {
			// A panic not fn's (see run), or an fn that ended the
			// goroutine (runtime.Goexit): the batch did not commit.
			err := errors.New("sqlite: write batch: a write ended its goroutine")
			if r != nil {
				err = fmt.Errorf("sqlite: write batch: %v", r)
			}
			for _, op := range batch {
				op.err = err
			}
		}
		for _, op := range batch {
			op.done <- op.err
		}
		if r != nil {
			panic(r)
		}
	}()
	s.runBatchTxs(batch)
	returned = true
}

// runBatchTxs runs batch's transactions for runBatch until one commits or
// fails, leaving each write's answer in its op.err.
func (s *SQLite) runBatchTxs(batch []*writeOp) {
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
	defer sqlTx.Rollback() // after a panic; a no-op once committed or rolled back
	tx := newWriteTx(sqlTx, s.wstmts)
	tx.guess = s.chainGuess
	ran := false
	for i, op := range todo {
		if err := op.ctx.Err(); err != nil {
			op.err = err
			continue
		}
		if i < plain {
			if op.err = op.run(tx); op.err != nil {
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
		op.err = op.run(tx)
		undo := []string{`RELEASE op`}
		if op.err != nil {
			undo = []string{`ROLLBACK TO op`, `RELEASE op`}
			// The write may have appended to the audit chain before it
			// failed: its record goes with the rollback.
			tx.head.known = false
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
	if tx.head.known {
		s.chainGuess = tx.head
	}
	return -1, false, nil
}

// run runs op's fn in tx; a panic of fn is its failure, kept for its caller.
func (op *writeOp) run(tx *writeTx) (err error) {
	op.panicked = nil
	defer func() {
		if r := recover(); r != nil {
			op.panicked, err = &writePanic{value: r, stack: debug.Stack()}, errWritePanicked
		}
	}()
	return op.fn(context.WithoutCancel(op.ctx), tx)
}
