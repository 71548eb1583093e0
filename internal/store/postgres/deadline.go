package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/muster-dev/muster/internal/store"
)

// DefaultRequestTimeout is how long a request to the database (a statement,
// a batch, a transaction from BEGIN to COMMIT, the wait for a connection
// included) may go unanswered before the store gives it up as
// store.ErrUnavailable: limits.store_timeout's default. A database that
// hangs (a stopped or overloaded server, a proxy or network path that
// keeps the connection but forwards nothing) refuses nothing, so without
// the store's own deadline a request waited for its caller's, and the
// caller learnt DEADLINE_EXCEEDED, not that the store was unavailable.
// Shorter than the 30 s agents give a renewal, so an agent hears
// UNAVAILABLE, which it retries, in time to retry; far longer than any
// request of a healthy database.
const DefaultRequestTimeout = 10 * time.Second

// longRequestTimeout bounds the requests that may legitimately run long on
// a healthy database (long): the cleaners' deletions of whatever expired
// since, a bulk load.
const longRequestTimeout = 10 * time.Minute

// errStoreDeadline is the cause of a context the store's own deadline
// ended, told apart from the caller's deadline or cancellation.
var errStoreDeadline = errors.New("the store's request deadline passed")

// longKey marks a context whose requests are bounded by longRequestTimeout.
type longKey struct{}

// long marks ctx for the requests that may legitimately take minutes.
func long(ctx context.Context) context.Context {
	return context.WithValue(ctx, longKey{}, true)
}

// limit is the deadline of one request as its failure names it: how long
// it may go unanswered (the store's timeout, or longRequestTimeout), and
// what bounds connecting, when the pool opens a connection for it.
type limit struct {
	timeout time.Duration
	// connect bounds connecting: the store URL's connect_timeout if
	// connectFromURL, else the store's timeout (dialHungPeers), also for
	// a long request.
	connect        time.Duration
	connectFromURL bool
}

// timeoutError is a request the database did not answer within the
// store's deadline: store.ErrUnavailable. It keeps the driver's message but
// not its chain, which holds context.DeadlineExceeded: the caller's own
// deadline had not passed.
type timeoutError struct {
	timeout time.Duration
	// setting names what set timeout, for the operator to change:
	// limits.store_timeout unless connecting ran out of the store URL's
	// connect_timeout, or a long request of its bound.
	setting string
	msg     string
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%v: the database did not answer within %s (%s): %s", store.ErrUnavailable, e.timeout, e.setting, e.msg)
}

func (e *timeoutError) Unwrap() error { return store.ErrUnavailable }

// newTimeoutError names the deadline that ran out: connecting's, when
// connect says it was (the store URL's connect_timeout if it set one,
// else the store's timeout, which Open makes the connect timeout), or the
// request's.
func newTimeoutError(l limit, connect bool, msg string) *timeoutError {
	switch {
	case connect && l.connectFromURL:
		return &timeoutError{timeout: l.connect, setting: "connect_timeout in the store URL; without it, limits.store_timeout bounds connecting", msg: msg}
	case connect:
		return &timeoutError{timeout: l.connect, setting: "limits.store_timeout", msg: msg}
	case l.timeout == longRequestTimeout:
		return &timeoutError{timeout: l.timeout, setting: "the bound of long requests", msg: msg}
	}
	return &timeoutError{timeout: l.timeout, setting: "limits.store_timeout", msg: msg}
}

// db is the connection pool as the store's requests use it: each request
// (a statement, a batch, a transaction) gets the store's own deadline,
// timeout after it starts (or the caller's, if that is sooner), and one
// that ran out of the store's deadline fails with store.ErrUnavailable
// (timeoutError), like a refused connection. The one place every request
// of the store's methods goes through: the pool itself (p) is used bare
// only by the migrations, which may take long and are bounded by Open's
// ctx; the leader's and the change listener's own connections use bound.
type db struct {
	p       *pgxpool.Pool
	timeout time.Duration
	// connect bounds connecting, from the store URL's connect_timeout if
	// connectFromURL (limit).
	connect        time.Duration
	connectFromURL bool
	// migrating is Open's WithMigrating (nil: none).
	migrating func(from, to int) error
}

// Config and Close are the pool's.
func (d *db) Config() *pgxpool.Config { return d.p.Config() }
func (d *db) Close()                  { d.p.Close() }

// limit is the deadline of a request starting now with ctx.
func (d *db) limit(ctx context.Context) (limit, time.Time) {
	t := d.timeout
	if ctx.Value(longKey{}) != nil {
		t = max(t, longRequestTimeout)
	}
	return limit{timeout: t, connect: d.connect, connectFromURL: d.connectFromURL}, time.Now().Add(t)
}

// until derives a request's context from the caller's ctx and the store's
// deadline: the sooner of the two ends it.
func until(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadlineCause(ctx, deadline, errStoreDeadline)
}

// timedOut returns err as a timeoutError if ctx (from until) ended by the
// store's deadline, or if connecting failed while ctx had not ended (the
// connect timeout ran out first: the store URL's connect_timeout, or the
// store's timeout, which Open makes it otherwise), and unchanged otherwise. An error of SQL the server sent stays itself,
// unless it is the cancellation the deadline caused (57014,
// query_canceled).
func timedOut(ctx context.Context, l limit, err error) error {
	// One already named (a statement's, read again as its batch's)
	// is not named twice.
	var te *timeoutError
	if err == nil || errors.As(err, &te) {
		return err
	}
	var pe *pgconn.PgError
	if ctx.Err() == nil && errors.As(err, &pe) && pe.Code == "57014" {
		// The server cancelled a statement its caller still waited for:
		// not this process's doing (its cancelled requests' connections
		// are never used again: cancelThenDrop) but the server's
		// statement_timeout, or an operator's pg_cancel_backend. Nothing
		// is wrong with the request: asked again it may pass, so it is
		// retried as a slow database's is, not reported as a bug.
		return fmt.Errorf("%w: the database cancelled the statement (its statement_timeout, or pg_cancel_backend; if the store URL sets statement_timeout, raise it): %w", store.ErrUnavailable, err)
	}
	var ce *pgconn.ConnectError
	connectTimeout := ctx.Err() == nil && errors.As(err, &ce) && errors.Is(err, context.DeadlineExceeded)
	if !connectTimeout && !errors.Is(context.Cause(ctx), errStoreDeadline) {
		return err
	}
	if errors.As(err, &pe) && pe.Code != "57014" {
		return err
	}
	return newTimeoutError(l, connectTimeout, err.Error())
}

// bound runs fn, a request on a connection of its own (the leader's, the
// change listener's), with the store's deadline, as the pool's requests
// have it.
func (d *db) bound(ctx context.Context, fn func(context.Context) error) error {
	t, end := d.limit(ctx)
	ctx, cancel := until(ctx, end)
	defer cancel()
	return timedOut(ctx, t, fn(ctx))
}

func (d *db) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t, end := d.limit(ctx)
	ctx, cancel := until(ctx, end)
	defer cancel()
	tag, err := d.p.Exec(ctx, sql, args...)
	return tag, timedOut(ctx, t, err)
}

func (d *db) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t, end := d.limit(ctx)
	return boundQuery(ctx, t, end, d.p.Query, sql, args...)
}

func (d *db) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t, end := d.limit(ctx)
	return boundQueryRow(ctx, t, end, d.p.QueryRow, sql, args...)
}

func (d *db) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t, end := d.limit(ctx)
	return boundSendBatch(ctx, t, end, d.p.SendBatch, b)
}

// BeginTx begins a transaction whose statements, commit included, share
// one deadline, timeout after BEGIN was asked for.
func (d *db) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	t, end := d.limit(ctx)
	bctx, cancel := until(ctx, end)
	defer cancel()
	tx, err := d.p.BeginTx(bctx, opts)
	if err != nil {
		return nil, timedOut(bctx, t, err)
	}
	return &boundTx{Tx: tx, timeout: t, end: end, rollbackTimeout: d.timeout}, nil
}

// acquire takes a connection for a pipe (pipe.go), which bounds its own
// batches by deadline (the same end, from its start).
func (d *db) acquire(ctx context.Context) (c *pgxpool.Conn, l limit, deadline time.Time, err error) {
	t, end := d.limit(ctx)
	actx, cancel := until(ctx, end)
	defer cancel()
	c, err = d.p.Acquire(actx)
	return c, t, end, timedOut(actx, t, err)
}

// rollbackContext bounds a rollback or cleanup statement, which runs even
// when its caller's ctx has ended (context.WithoutCancel), by the store's
// timeout: a hung database must not hold it, and its connection, forever.
func (d *db) rollbackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
}

// boundQuery runs query with the store's deadline; the rows end the
// request's context when they are closed or read to the end.
func boundQuery(ctx context.Context, t limit, end time.Time,
	query func(context.Context, string, ...any) (pgx.Rows, error), sql string, args ...any) (pgx.Rows, error) {
	ctx, cancel := until(ctx, end)
	rows, err := query(ctx, sql, args...)
	if err != nil {
		defer cancel()
		return nil, timedOut(ctx, t, err)
	}
	return &boundRows{Rows: rows, ctx: ctx, cancel: cancel, timeout: t}, nil
}

func boundQueryRow(ctx context.Context, t limit, end time.Time,
	query func(context.Context, string, ...any) pgx.Row, sql string, args ...any) pgx.Row {
	ctx, cancel := until(ctx, end)
	return &boundRow{row: query(ctx, sql, args...), ctx: ctx, cancel: cancel, timeout: t}
}

func boundSendBatch(ctx context.Context, t limit, end time.Time,
	send func(context.Context, *pgx.Batch) pgx.BatchResults, b *pgx.Batch) pgx.BatchResults {
	ctx, cancel := until(ctx, end)
	return &boundBatch{BatchResults: send(ctx, b), ctx: ctx, cancel: cancel, timeout: t}
}

type boundRows struct {
	pgx.Rows
	ctx     context.Context
	cancel  context.CancelFunc
	timeout limit
	// done: the rows are closed and err is their error, read before
	// cancel (which would hide the deadline's cause).
	done bool
	err  error
}

func (r *boundRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish() // pgx closed the rows
	return false
}

func (r *boundRows) Close() {
	r.Rows.Close()
	r.finish()
}

func (r *boundRows) finish() {
	if !r.done {
		r.done, r.err = true, timedOut(r.ctx, r.timeout, r.Rows.Err())
		r.cancel()
	}
}

func (r *boundRows) Err() error {
	if r.done {
		return r.err
	}
	return timedOut(r.ctx, r.timeout, r.Rows.Err())
}

type boundRow struct {
	row     pgx.Row
	ctx     context.Context
	cancel  context.CancelFunc
	timeout limit
}

func (r *boundRow) Scan(dest ...any) error {
	defer r.cancel()
	return timedOut(r.ctx, r.timeout, r.row.Scan(dest...))
}

type boundBatch struct {
	pgx.BatchResults
	ctx     context.Context
	cancel  context.CancelFunc
	timeout limit
}

func (b *boundBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	return tag, timedOut(b.ctx, b.timeout, err)
}

func (b *boundBatch) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	if err != nil {
		return rows, timedOut(b.ctx, b.timeout, err)
	}
	return &boundRows{Rows: rows, ctx: b.ctx, cancel: func() {}, timeout: b.timeout}, nil
}

func (b *boundBatch) QueryRow() pgx.Row {
	return &boundRow{row: b.BatchResults.QueryRow(), ctx: b.ctx, cancel: func() {}, timeout: b.timeout}
}

func (b *boundBatch) Close() error {
	defer b.cancel()
	return timedOut(b.ctx, b.timeout, b.BatchResults.Close())
}

// boundTx is a transaction whose every statement ends at the transaction's
// deadline (end) or its caller's, whichever is sooner: the store's methods
// pass a transaction's statements their own ctx, not the one it began
// with.
type boundTx struct {
	pgx.Tx
	timeout         limit
	end             time.Time
	rollbackTimeout time.Duration
}

func (tx *boundTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, cancel := until(ctx, tx.end)
	defer cancel()
	tag, err := tx.Tx.Exec(ctx, sql, args...)
	return tag, timedOut(ctx, tx.timeout, err)
}

func (tx *boundTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return boundQuery(ctx, tx.timeout, tx.end, tx.Tx.Query, sql, args...)
}

func (tx *boundTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return boundQueryRow(ctx, tx.timeout, tx.end, tx.Tx.QueryRow, sql, args...)
}

func (tx *boundTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return boundSendBatch(ctx, tx.timeout, tx.end, tx.Tx.SendBatch, b)
}

func (tx *boundTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	ctx, cancel := until(ctx, tx.end)
	defer cancel()
	n, err := tx.Tx.CopyFrom(ctx, table, columns, src)
	return n, timedOut(ctx, tx.timeout, err)
}

func (tx *boundTx) Commit(ctx context.Context) error {
	ctx, cancel := until(ctx, tx.end)
	defer cancel()
	return timedOut(ctx, tx.timeout, tx.Tx.Commit(ctx))
}

// Rollback is bounded by the store's timeout from now, not by the
// transaction's deadline: it runs after that may have passed (a
// statement's own error, a commit the deadline cut short), and must reach
// the server to release the transaction's locks soon.
func (tx *boundTx) Rollback(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, tx.rollbackTimeout)
	defer cancel()
	return tx.Tx.Rollback(ctx)
}
