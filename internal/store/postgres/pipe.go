package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pipe is one READ COMMITTED transaction on one connection whose
// statements travel in batches: BEGIN goes out with the first batch and
// COMMIT with the last, so a transaction of n dependent steps costs n round
// trips rather than one per statement and two more for BEGIN and COMMIT.
// Each queued statement carries the function that reads its answer; a
// batch's answers are read in order, and the first that returns an error
// ends the transaction (the statements after it were sent, and are undone
// with everything else by the rollback).
//
// A read's own refusal (a spent token, a lost race, a retry: the
// statement ran and said no) is kept by the pipe, not handed to pgx:
// pgx takes any error of a batch for a sign that its statements went
// stale, and forgets every statement it had prepared for the batch on that
// connection — a DEALLOCATE and a new PREPARE per statement, two more round
// trips on the next request, for an answer that was not an error of SQL.
//
// A pipe that is not committed is rolled back, so an operation that finds
// it has nothing to write (a retry) just returns.
type pipe struct {
	conn *pgxpool.Conn
	// op names the operation: the prefix of an error of a batch that no
	// read saw to wrap (send).
	op    string
	chain *chain // the Store's, for an append to the audit chain (chain.go)
	batch *pgx.Batch
	// refused is the first refusal a read returned in the batch being
	// read: what send returns.
	refused error
	// failed is the first error of a statement a read returned in the
	// batch being read, wrapped with its op: any other error send gets
	// is the batch's own.
	failed error
	// end is the transaction's deadline, timeout after it began
	// (deadline.go): every batch ends by then.
	timeout limit
	end     time.Time
}

// inPipe runs fn on a pipe and rolls the transaction back unless fn
// committed it.
func (s *Store) inPipe(ctx context.Context, op string, fn func(p *pipe) error) error {
	c, timeout, end, err := s.pool.acquire(ctx)
	if err != nil {
		return wrap(op+": acquire", err)
	}
	defer c.Release()
	p := &pipe{conn: c, op: op, chain: s.chain, batch: &pgx.Batch{}, timeout: timeout, end: end}
	p.exec(`BEGIN ISOLATION LEVEL READ COMMITTED`, nil, func(_ pgconn.CommandTag, err error) error {
		if err != nil {
			return wrap(op+": begin", err)
		}
		return nil
	})
	err = fn(p)
	// 'T': in a transaction, 'E': in a failed one. A connection lost
	// mid-way is closed, and the pool drops it on Release; the server
	// rolls its transaction back.
	if st := c.Conn().PgConn().TxStatus(); st == 'T' || st == 'E' {
		rctx, cancel := s.pool.rollbackContext(ctx)
		c.Exec(rctx, `ROLLBACK`)
		cancel()
	}
	return err
}

// exec queues a statement whose command tag (or error) read checks.
func (p *pipe) exec(sql string, args []any, read func(pgconn.CommandTag, error) error) {
	p.batch.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return p.fail(read(tag, err))
		}
		return p.refuse(read(tag, nil))
	}
}

// row queues a statement that answers with at most one row, which read
// scans (pgx.ErrNoRows when there is none).
func (p *pipe) row(sql string, args []any, read func(pgx.Row) error) {
	p.batch.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		row := &scannedRow{Row: br.QueryRow()}
		err := read(row)
		if err != nil && row.err != nil && !errors.Is(row.err, pgx.ErrNoRows) {
			return p.fail(err) // the statement's own error
		}
		return p.refuse(err)
	}
}

// refuse keeps a read's refusal, the first of the batch, and answers pgx
// that all is well.
func (p *pipe) refuse(err error) error {
	if err != nil && p.refused == nil {
		p.refused = err
	}
	return nil
}

// fail keeps the error of a statement a read returned, the first of the
// batch, and hands it on to pgx, which stops reading there.
func (p *pipe) fail(err error) error {
	if err != nil && p.failed == nil {
		p.failed = err
	}
	return err
}

// scannedRow remembers what Scan returned, so a read's error can be told
// apart: the statement's, or the read's own refusal of a good answer.
type scannedRow struct {
	pgx.Row
	err error
}

func (r *scannedRow) Scan(dest ...any) error {
	r.err = r.Row.Scan(dest...)
	return r.err
}

// send sends what is queued, in one round trip, and reads the answers.
func (p *pipe) send(ctx context.Context) error {
	if p.batch.Len() == 0 {
		return nil
	}
	b := p.batch
	p.batch = &pgx.Batch{}
	err := boundSendBatch(ctx, p.timeout, p.end, p.conn.SendBatch, b).Close()
	refused, failed := p.refused, p.failed
	p.refused, p.failed = nil, nil
	switch {
	case refused != nil:
		// A refusal came before any statement error: pgx stops reading
		// at the first error it is given.
		err = refused
	case err != nil && (failed == nil || !errors.Is(err, failed)):
		// The batch's own error, which no read saw: a statement that
		// could not be prepared, the connection lost or the deadline
		// passed before the answers came. It names the operation as a
		// statement's error does, and maps as it does (wrap).
		return wrap(p.op, err)
	}
	// A statement's error is wrapped by its read.
	return unavailable(err)
}

// simple runs sql alone as a simple query (no prepare), by the pipe's
// deadline.
func (p *pipe) simple(ctx context.Context, sql string) error {
	ctx, cancel := until(ctx, p.end)
	defer cancel()
	return timedOut(ctx, p.timeout, p.conn.Conn().PgConn().Exec(ctx, sql).Close())
}

// commit sends what is queued with COMMIT after it. Every caller sends a
// read that may refuse (a row not found, a condition not met) before commit,
// in a batch of its own: a refusal in the batch that carries COMMIT would be
// returned as an error after the server had committed the transaction.
func (p *pipe) commit(ctx context.Context, op string) error {
	p.exec(`COMMIT`, nil, func(tag pgconn.CommandTag, err error) error {
		switch {
		case err != nil:
			return wrap(op+": commit", err)
		case tag.String() == "ROLLBACK":
			// COMMIT of a failed transaction answers ROLLBACK.
			return wrap(op+": commit", pgx.ErrTxCommitRollback)
		}
		return nil
	})
	return p.send(ctx)
}

// wrapped is a read that only wraps a statement's error with op.
func wrapped(op string) func(pgconn.CommandTag, error) error {
	return func(_ pgconn.CommandTag, err error) error {
		if err != nil {
			return wrap(op, err)
		}
		return nil
	}
}

// wrappedOne is wrapped for a statement that must change a row: none is
// its error when it changed nothing.
func wrappedOne(op string, none error) func(pgconn.CommandTag, error) error {
	return func(tag pgconn.CommandTag, err error) error {
		if err != nil {
			return wrap(op, err)
		}
		if tag.RowsAffected() == 0 {
			return none
		}
		return nil
	}
}

// explain turns a lost write (lostWrite) into its reason: it rolls the
// transaction back and reads the write's row in one round trip, in a
// statement whose snapshot sees every commit the write waited on. A
// rollback first, so the transaction's locks (a row's, the node's, the
// audit chain's) are released with the first round trip of the failure
// path rather than after the reason is read. Any other error is returned
// as it is.
func (p *pipe) explain(ctx context.Context, op string, err error) error {
	var lost *lostWrite
	if !errors.As(err, &lost) {
		return err
	}
	p.batch = &pgx.Batch{}
	p.exec(`ROLLBACK`, nil, wrapped(op+": rollback"))
	p.row(lost.why.sql, lost.why.args, lost.why.read)
	if err := p.send(ctx); err != nil {
		return err
	}
	// Every reason read returns its sentinel; one that did not must still
	// not pass for a success.
	return fmt.Errorf("postgres: %s: %w", op, lost)
}
