package sqlite

import (
	"context"
	"database/sql"
	"sync"
)

// Prepared statements. SQLite spends as long parsing a short statement as
// running it, and every join runs the same dozen statements, so each query
// text is prepared once per connection and reused: database/sql keeps a
// *sql.Stmt's per-connection handles, and a transaction borrows the
// writer's handle with Tx.StmtContext.

type stmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
	// pending holds queries seen inside a write transaction and not yet
	// prepared: the writer has one connection, which the transaction
	// holds, so they are prepared between transactions (preparePending).
	pending map[string]bool
}

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, m: map[string]*sql.Stmt{}, pending: map[string]bool{}}
}

// cached returns the prepared statement of query, or nil after noting it
// for preparePending.
func (c *stmtCache) cached(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.m[query]
	if st == nil && c.m != nil {
		c.pending[query] = true
	}
	return st
}

// preparePending prepares the queries noted by cached. It must run while
// no transaction holds the writer.
func (c *stmtCache) preparePending(ctx context.Context) {
	c.mu.Lock()
	var qs []string
	for q := range c.pending {
		qs = append(qs, q)
	}
	clear(c.pending)
	c.mu.Unlock()
	for _, q := range qs {
		if _, err := c.get(ctx, q); err != nil {
			return // the statement runs unprepared, as before
		}
	}
}

func (c *stmtCache) get(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	if st, ok := c.m[query]; ok {
		c.mu.Unlock()
		return st, nil
	}
	c.mu.Unlock()
	// Prepared outside the lock: preparing may wait for a connection.
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		st.Close()
		return nil, sql.ErrConnDone
	}
	if prev, ok := c.m[query]; ok {
		st.Close()
		return prev, nil
	}
	c.m[query] = st
	return st, nil
}

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.m {
		st.Close()
	}
	c.m = nil
}

// readDB is the read pool with cached statements for its queries.
type readDB struct {
	*sql.DB
	cache *stmtCache
}

func (r *readDB) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := r.cache.get(ctx, query)
	if err != nil {
		return r.DB.QueryRowContext(ctx, query, args...) // reports the error through Scan
	}
	return st.QueryRowContext(ctx, args...)
}

// lookup is QueryRowContext for a read the request path makes through an
// index (a join's or a renewal's reads, the verifier set's ID). It runs
// without the caller's cancellation: database/sql and the driver honour a
// cancellable context by starting a goroutine each per query
// (Rows.awaitDone, the driver's interrupt watcher), which a profile of
// joins and renewals showed, and neither can end a read of microseconds
// much sooner than it ends. A context already ended still ends the read
// before it starts, with the context's error. What still bounds the read:
// SQLite's busy timeout (busyTimeoutMS) on any lock it waits for, and the
// read pool's connections, each held only by a statement that is itself
// bounded (a lookup, or a list under its caller's deadline).
func (r *readDB) lookup(ctx context.Context, query string, args ...any) *sql.Row {
	if ctx.Err() == nil {
		ctx = context.WithoutCancel(ctx)
	}
	return r.QueryRowContext(ctx, query, args...)
}

func (r *readDB) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := r.cache.get(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// writeTx is a write transaction whose statements come from the writer's
// cache.
type writeTx struct {
	*sql.Tx
	cache *stmtCache
	// stmts are the transaction's handles (Tx.StmtContext) of the cached
	// statements it ran, kept for the transaction: the writes of a batch
	// run the same few statements, and each Tx.StmtContext makes a new
	// handle (several allocations).
	stmts []txStmt
	buf   [16]txStmt // stmts' first array
	// head is the audit chain's head as the transaction has left it, if
	// known (audit.go, txHead).
	head txHead
	// guess is the head the last committed transaction left
	// (SQLite.chainGuess): unchecked, as another process may have
	// appended since, so an append built on it inserts only if it is
	// still the head (appendAudit).
	guess txHead
}

type txStmt struct{ parent, st *sql.Stmt }

func newWriteTx(tx *sql.Tx, cache *stmtCache) *writeTx {
	t := &writeTx{Tx: tx, cache: cache}
	t.stmts = t.buf[:0]
	return t
}

// stmt is the transaction's handle of the cached statement parent.
func (t *writeTx) stmt(parent *sql.Stmt) *sql.Stmt {
	for _, s := range t.stmts {
		if s.parent == parent {
			return s.st
		}
	}
	// Not the write's ctx: Tx.StmtContext gives a handle that fails with
	// ctx's error for good if ctx has ended, and the handle is kept for
	// the writes after this one. The statement is already prepared on the
	// one writer connection, so nothing here waits.
	st := t.Tx.StmtContext(context.Background(), parent)
	t.stmts = append(t.stmts, txStmt{parent, st})
	return st
}

func (t *writeTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := t.cache.cached(query); st != nil {
		return t.stmt(st).QueryRowContext(ctx, args...)
	}
	return t.Tx.QueryRowContext(ctx, query, args...)
}

func (t *writeTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := t.cache.cached(query); st != nil {
		return t.stmt(st).ExecContext(ctx, args...)
	}
	return t.Tx.ExecContext(ctx, query, args...)
}

// argsBuf: the request path builds a statement's arguments in a
// fixed-size array of its own frame (var buf [N]any; buf[:0]), sized for
// the usual count, rather than in a make([]any, 0, n) of a length known
// only at run time, which the compiler puts on the heap once it is over
// 32 bytes (two arguments): database/sql does not keep the slice past the
// call, so the array stays on the stack. More arguments than it holds
// grow onto the heap, as the make did.
