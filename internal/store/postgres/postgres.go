// Package postgres is the store.Store backend for replicated authorities:
// several muster processes share one PostgreSQL database through pgx's
// connection pool (database/sql is not used).
//
// Everything that must happen once is a conditional write, a unique
// constraint or a transaction-scoped advisory lock inside one READ COMMITTED
// transaction, so the contract of package store holds across processes:
//
//   - a use of a token of N uses is one UPDATE whose WHERE clause
//     re-checks the remaining uses and the expiry on the row version it
//     locks; a use of a token of unlimited uses is a row appended to
//     token_uses, under the token's advisory lock taken shared, which its
//     deletion takes exclusive;
//   - a renewal is one UPDATE … WHERE generation = $n AND state = 'current'
//     AND no lock is in force on its targets, each of whose advisory locks
//     it holds shared, which a lock's creation takes exclusive (so a
//     join's or renewal's lock check and a lock's commit take turns);
//   - the audit chain has one writer at a time, serialized by
//     pg_advisory_xact_lock(auditLockKey) taken before the head is read
//     (or before a record built on a guessed head is inserted only if the
//     head is the guessed one: chain.go);
//   - joins of one node ID are serialized by an advisory lock on the ID, so
//     a lost race reports ErrNodeTaken (or supersedes) exactly as a later
//     join would, and the unique index instances_one_current stays the last
//     line of defence;
//   - a referral ticket's use is an INSERT … ON CONFLICT DO NOTHING on its
//     jti, the primary key of ticket_uses, in the join's transaction;
//   - a discovery registration is one INSERT … ON CONFLICT DO UPDATE whose
//     WHERE clause admits only a higher version under the same root;
//   - a ticket-key rotation locks the retiring key's row, and the partial
//     unique index ticket_keys_one_active admits one active key.
//
// The schema is created by the numbered migrations embedded from
// migrations/, each applied in its own transaction and recorded in
// schema_migrations, under a session advisory lock so that replicas starting
// together apply each migration once. Times are stored as BIGINT unix
// microseconds in UTC, a zero time as NULL, like the SQLite store.
//
// The store clock is the database server's clock_timestamp(), read inside
// the statements that compare against it: every replica shares one clock,
// with microsecond resolution.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/muster-dev/muster/internal/store"
)

// Store is a store.Store kept in a PostgreSQL database. It is safe for
// concurrent use by multiple goroutines and by multiple processes sharing
// the database.
type Store struct {
	// pool bounds each request by the store's own deadline (deadline.go).
	pool *db
	// created: Open made the schema (DropCreated).
	created bool
	// chain orders this Store's appends to the audit chain (chain.go).
	chain *chain
	// poolFromURL: the URL's pool_max_conns sized the pool.
	poolFromURL bool
}

var _ store.Store = (*Store)(nil)

// nowMicros is the store clock in SQL, as unix microseconds. clock_timestamp
// is the moment the expression is evaluated, not the start of the
// transaction or statement, so a write that waited for a row lock compares
// deadlines against the time it actually takes effect.
const nowMicros = `(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint`

// Advisory lock keys. The single-bigint and the two-int4 key spaces do not
// overlap, so node locks (nodeLockClass, hashtext(id)) never meet these.
const (
	migrateLockKey int64 = 0x6d75737465720001 // "muster" + 1: schema migrations
	auditLockKey   int64 = 0x6d75737465720002 // the audit chain's single writer
	// servingLockKey: held shared by every authority serving on the
	// store, exclusively by an offline command that must run with none
	// (serving.go).
	servingLockKey int64 = 0x6d75737465720004 // 3 is pskLockKey (psks.go)
	nodeLockClass  int32 = 0x6d757374         // joins of one node ID
	// operatorLockClass serializes issuing certificates to one operator
	// name (with hashtext(name)).
	operatorLockClass int32 = 0x6d757375
	// tokenLockClass orders a token's uses before its deletion (with
	// hashtext(id); claims.go, useToken).
	tokenLockClass int32 = 0x6d757376
	// lockTargetClass orders a lock's creation against the joins and
	// renewals its target would refuse (with hashtext(kind || ' ' ||
	// target); locks.go, targetLocksQuery).
	lockTargetClass int32 = 0x6d757377
	// batonClass: an append's place in its Store's order of appends to
	// the audit chain (with a number of the Store's; chain.go).
	batonClass int32 = 0x6d757378
)

// Open connects to the database at url (a postgres:// or postgresql:// URL
// or a key=value connection string, as pgx accepts) and migrates it to the
// newest schema this binary knows. It fails with an error wrapping
// store.ErrSchemaTooNew if the database was migrated by a newer binary.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
	d, poolFromURL, err := newPool(ctx, url, opts...)
	if err != nil {
		return nil, err
	}
	// Migrations run under ctx alone: a long one on a big table must not
	// be cut by the deadline of a request.
	created, err := migrate(ctx, d.p, d.migrating)
	if err != nil {
		d.Close()
		// A database that is not there says so (store.ErrUnavailable),
		// so that a caller does not blame the password.
		return nil, unavailable(err)
	}
	return &Store{pool: d, created: created, chain: newChain(), poolFromURL: poolFromURL}, nil
}

// newPool makes the connection pool Open migrates and the store uses; it
// connects to nothing yet.
func newPool(ctx context.Context, url string, opts ...Option) (d *db, poolFromURL bool, err error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The error may quote the URL, password and all.
		return nil, false, errors.New("postgres: invalid connection URL")
	}
	cancelThenDrop(cfg)
	poolFromURL = setsPoolMaxConns(url)
	if !poolFromURL {
		cfg.MaxConns = DefaultPoolMaxConns
	}
	o := options{pool: cfg, timeout: DefaultRequestTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	// Read before dialHungPeers gives connecting the store's timeout: a
	// connect that runs out of the URL's own names that setting.
	fromURL := cfg.ConnConfig.ConnectTimeout > 0
	dialHungPeers(&cfg.ConnConfig.Config, o.timeout)
	pingHeldConns(cfg, o.timeout)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, false, fmt.Errorf("postgres: open: %w", err)
	}
	return &db{p: pool, timeout: o.timeout, connect: cfg.ConnConfig.ConnectTimeout, connectFromURL: fromURL, migrating: o.migrating}, poolFromURL, nil
}

// pingHeldConns makes the pool ask a connection it holds whether the
// database still answers, within timeout (the store's), before a long
// request (long) is sent on it, and before any request once it has been
// idle a second (pgx's own rule). A long request's deadline is minutes: on
// a held connection to a database that hangs, it used to wait for its
// caller's deadline instead of failing with store.ErrUnavailable in the
// store's timeout, as every other request, and every one that must
// connect, does. A ping that goes unanswered drops the connection; the
// request then connects anew, bounded by the store's timeout too, and a
// database still hung fails it with store.ErrUnavailable (timedOut). A
// long request is rare (the cleaners, a bulk load): one more round trip.
// The store URL's pool_ping_timeout, if any, is kept.
func pingHeldConns(cfg *pgxpool.Config, timeout time.Duration) {
	cfg.ShouldPing = func(ctx context.Context, p pgxpool.ShouldPingParams) bool {
		return p.IdleDuration > time.Second || ctx.Value(longKey{}) != nil
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = timeout
	}
}

// cancelThenDrop makes a statement whose context ends be cancelled on the
// server (a CancelRequest) before the socket is closed: closed alone
// (pgconn's DeadlineContextWatcherHandler), it left a transaction waiting
// for a lock to go on and commit after its caller was told it failed
// (TestChainCancelledLinkDoesNotCommit). But a cancel request travels on a
// connection of its own and PostgreSQL acts on it when it gets to it: pgconn
// stops waiting for it when the statement ends by itself and gives the
// connection back 100 ms later, and one the server handled later (under
// load) cancelled whatever the connection's next user ran, another
// request, which failed with 57014 (TestStrayCancelSparesTheNextRequest).
// So a connection whose context ended during a request is never used
// again: the pool drops it before its next request. A late cancel request
// then names a backend that has gone (or is idle, which ignores it). The
// cost, a new connection, is paid only after a cancellation; the normal
// path reads one flag when it takes a connection.
func cancelThenDrop(cfg *pgxpool.Config) {
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		h := &cancelWatcher{CancelRequestContextWatcherHandler: pgconn.CancelRequestContextWatcherHandler{Conn: c, CancelRequestDelay: 0, DeadlineDelay: 5 * time.Second}}
		// Built while the connection is set up, before anyone else
		// can read its custom data.
		c.CustomData()[cancelWatcherKey] = h
		return h
	}
	cfg.PrepareConn = func(_ context.Context, c *pgx.Conn) (bool, error) {
		h, _ := c.PgConn().CustomData()[cancelWatcherKey].(*cancelWatcher)
		return h == nil || !h.cancelled.Load(), nil
	}
}

// cancelWatcherKey keys a connection's cancelWatcher in its custom data.
const cancelWatcherKey = "muster.cancelWatcher"

// cancelWatcher is pgconn's CancelRequestContextWatcherHandler that
// remembers it sent (or began to send) a cancel request.
type cancelWatcher struct {
	pgconn.CancelRequestContextWatcherHandler
	cancelled atomic.Bool
}

func (h *cancelWatcher) HandleCancel(ctx context.Context) {
	h.cancelled.Store(true)
	h.CancelRequestContextWatcherHandler.HandleCancel(ctx)
}

// DefaultPoolMaxConns is the connection pool's size when the store URL sets
// no pool_max_conns. pgx's own default, the larger of 4 and the cores, was
// the limit of joins and renewals once the database is a few milliseconds
// away: a join holds its connection for 5 round trips and a commit
// (docs/performance.md, "The connection pool's size"). 16 with the leader's
// and the change listener's connections is 18 a replica, so 4 replicas and
// an operator's sessions stay within PostgreSQL's default max_connections
// of 100.
const DefaultPoolMaxConns = 16

// setsPoolMaxConns reports whether a connection string (URL or key=value
// form) names pool_max_conns, which then decides the pool's size. It asks
// pgconn's own parser, which keeps a key it does not know (as this one) in
// RuntimeParams, so quoting and escapes read as pgxpool reads them.
func setsPoolMaxConns(conn string) bool {
	c, err := pgconn.ParseConfig(conn)
	if err != nil {
		return false
	}
	_, ok := c.RuntimeParams["pool_max_conns"]
	return ok
}

// PoolMaxConns is the most connections the Store's pool opens, and whether
// the store URL's pool_max_conns set it (otherwise DefaultPoolMaxConns,
// or an Option, did). The leader lock and the change listener each hold one
// more connection outside the pool.
func (s *Store) PoolMaxConns() (n int32, fromURL bool) {
	return s.pool.Config().MaxConns, s.poolFromURL
}

// Option adjusts the store Open makes.
type Option func(*options)

type options struct {
	pool      *pgxpool.Config
	timeout   time.Duration
	migrating func(from, to int) error
}

// WithMigrating has Open call f before it applies any migration, with the
// schema version the database is at and the one it migrates to: a
// migration of a large table takes seconds or more, during which the
// caller cannot serve, and an upgrade should say so while it happens. An
// error from f stops Open before any migration, and Open returns it: a
// caller that must not move the schema on (a command beside running
// authorities of an older version) refuses so. Of
// replicas starting together, only the one that migrates calls it.
func WithMigrating(f func(from, to int) error) Option {
	return func(o *options) { o.migrating = f }
}

// WithTracer sends every statement and batch the store runs to t (a
// pgx.QueryTracer, and a pgx.BatchTracer if it is one too): the test that
// counts a join's round trips uses it.
func WithTracer(t pgx.QueryTracer) Option {
	return func(o *options) { o.pool.ConnConfig.Tracer = t }
}

// WithRequestTimeout sets how long a request may go unanswered before it
// fails with store.ErrUnavailable (limits.store_timeout; default
// DefaultRequestTimeout; deadline.go). Zero or less keeps the default.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// RequestTimeout is the store's deadline for one request (WithRequestTimeout).
func (s *Store) RequestTimeout() time.Duration {
	return s.pool.timeout
}

// Close closes the pool, waiting for connections in use to be released.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// SchemaVersion returns the highest migration applied to the database.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	v, err := schemaVersion(ctx, s.pool)
	if err != nil {
		return 0, fmt.Errorf("postgres: schema version: %w", unavailable(err))
	}
	return v, nil
}

// Now returns the database server's clock, to the microsecond, in UTC.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var us int64
	if err := s.pool.QueryRow(ctx, `SELECT `+nowMicros).Scan(&us); err != nil {
		return time.Time{}, fmt.Errorf("postgres: now: %w", unavailable(err))
	}
	return time.UnixMicro(us).UTC(), nil
}

// querier is what the pool, a connection and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// inTx runs fn in a READ COMMITTED transaction and commits it if fn
// succeeds; on any error it is rolled back.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx pgx.Tx) error) error {
	// The transaction's statements, its commit included, share one
	// deadline (db.BeginTx).
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return wrap(op+": begin", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return wrap(op+": commit", err)
	}
	return nil
}

// uniqueViolation is SQLSTATE 23505.
const uniqueViolation = "23505"

// wrap maps driver errors to the store sentinels and prefixes op.
func wrap(op string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres: %s: %w", op, store.ErrNotFound)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == uniqueViolation {
		return fmt.Errorf("postgres: %s: %w: %v", op, store.ErrConflict, err)
	}
	// Class 53, insufficient resources: disk full (53100), out of memory,
	// too many connections. The statement failed whole.
	if errors.As(err, &pe) && strings.HasPrefix(pe.Code, "53") {
		return fmt.Errorf("postgres: %s: %w: %v", op, store.ErrUnavailable, err)
	}
	return fmt.Errorf("postgres: %s: %w", op, unavailable(err))
}

// constraintOf returns the constraint a unique violation names, or "".
func constraintOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == uniqueViolation {
		return pe.ConstraintName
	}
	return ""
}

// timeArg converts t to its column value: unix microseconds in UTC (finer
// digits dropped), or NULL for the zero time.
func timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.Truncate(time.Microsecond).UnixMicro()
}

// timeCol converts a column value written by timeArg back to a time.Time.
func timeCol(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return time.UnixMicro(*v).UTC()
}

// collect scans every row and closes rows.
func collect[T any](rows pgx.Rows, op string, scan func(pgx.Row) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, wrap(op, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(op, err)
	}
	return out, nil
}

// execOne runs a statement that must affect one row; ErrNotFound if it
// affected none.
func execOne(ctx context.Context, q querier, op, sql string, args ...any) error {
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return wrap(op, err)
	}
	if tag.RowsAffected() == 0 {
		return wrap(op, pgx.ErrNoRows)
	}
	return nil
}
