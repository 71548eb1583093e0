// Package sqlite is the embedded store.Store backend: one SQLite database
// file, opened with the pure-Go modernc.org/sqlite driver.
//
// The database runs in WAL mode with synchronous=FULL, so a write that has
// returned survives a power cut. Writes go through a single connection whose
// transactions begin IMMEDIATE: they queue in the process instead of failing
// with SQLITE_BUSY, and a read-modify-write such as AppendAudit holds the
// write lock from its first read. Reads use a separate pool of query-only
// connections and never wait for writers.
//
// The schema is created by the numbered migrations embedded from migrations/,
// each applied in its own transaction and recorded in schema_migrations.
// Times are stored as INTEGER unix microseconds in UTC, a zero time as NULL.
//
// The store clock is SQLite's own ('now'), read inside the statements that
// compare against it. It is the clock of the machine holding the database
// file, which for an embedded database is the authority's machine; its
// resolution is one millisecond.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/muster-dev/muster/internal/store"
)

// SQLite is a store.Store kept in one SQLite database file. It is safe for
// concurrent use by multiple goroutines.
type SQLite struct {
	// w is the single writer connection; its transactions begin IMMEDIATE.
	w *sql.DB
	// r is the read pool; its connections are query_only.
	r *readDB
	// wstmts caches the writer's prepared statements.
	wstmts *stmtCache

	// hub announces committed changes to watchers (changes.go); path is
	// its key.
	hub  *changeHub
	path string

	// The group commit's queue and its leader (batch.go), under writeMu.
	writeMu     sync.Mutex
	queue       []*writeOp
	leading     bool       // a caller runs a batch, or is chosen to run the next
	writeIdle   sync.Cond  // signalled when leading ends
	writeClosed bool       // Close was called: no write is queued any more
	batch       []*writeOp // the leader's buffer for its batch
	// chainGuess is the audit chain's head as the last transaction that
	// knew it left it when it committed: the next transaction's guess,
	// which its first append checks in its insert (audit.go,
	// appendAudit). Only the batch's leader touches it.
	chainGuess txHead
}

var _ store.Store = (*SQLite)(nil)

// busyTimeoutMS bounds how long a connection waits for a lock held by
// another process (or by a WAL checkpoint) before failing with SQLITE_BUSY.
const busyTimeoutMS = 10000

// nowMicros is the store clock in SQL, as unix microseconds. 'now' is fixed
// for the duration of one statement and has millisecond resolution, so it is
// rounded to whole milliseconds to cancel the floating-point error of
// julianday.
const nowMicros = `(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

// Open opens the database at path, creating the file with mode 0600 if it
// does not exist, and migrates it to the newest schema this binary knows. It
// fails with an error wrapping store.ErrSchemaTooNew if the database was
// migrated by a newer binary. path must name a file: in-memory databases are
// not supported, as the read pool and the writer would not share them.
func Open(ctx context.Context, path string, opts ...Option) (*SQLite, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	if err := createPrivate(abs); err != nil {
		return nil, err
	}

	w, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_pragma": {
			fmt.Sprintf("busy_timeout(%d)", busyTimeoutMS),
			"journal_mode(WAL)",
			"synchronous(FULL)",
			"foreign_keys(1)",
		},
		"_txlock": {"immediate"},
	}))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)

	s := &SQLite{w: w}
	s.writeIdle.L = &s.writeMu
	if err := s.init(ctx, abs, o.migrating); err != nil {
		w.Close()
		return nil, err
	}

	// journal_mode is a property of the file, set above by the writer, so
	// the readers do not repeat it.
	r, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_pragma": {
			fmt.Sprintf("busy_timeout(%d)", busyTimeoutMS),
			"foreign_keys(1)",
			"query_only(1)",
		},
	}))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	if err := r.PingContext(ctx); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	s.r = &readDB{DB: r, cache: newStmtCache(r)}
	s.wstmts = newStmtCache(w)
	s.path, s.hub = abs, acquireHub(abs)
	return s, nil
}

// Option adjusts what Open does.
type Option func(*options)

type options struct {
	migrating func(from, to int) error
}

// WithMigrating has Open call f before it applies any migration, with the
// schema version the database is at and the one it migrates to: a
// migration of a large table takes seconds or more, during which the
// caller cannot serve, and an upgrade should say so while it happens. An
// error from f stops Open before any migration, and Open returns it: a
// caller that must not move the schema on (a command beside running
// authorities of an older version) refuses so.
func WithMigrating(f func(from, to int) error) Option {
	return func(o *options) { o.migrating = f }
}

// init checks the writer connection and migrates the schema.
func (s *SQLite) init(ctx context.Context, abs string, migrating func(from, to int) error) error {
	var mode string
	if err := s.w.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	if mode != "wal" {
		return fmt.Errorf("sqlite: open %s: journal_mode is %q, want wal", abs, mode)
	}
	return migrate(ctx, s.w, migrating)
}

// dsn builds a file: URI so that any path, including one holding '?' or
// '#', reaches SQLite intact; the driver reads its own parameters from the
// query and SQLite ignores them.
func dsn(abs string, q url.Values) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), OmitHost: true, RawQuery: q.Encode()}
	return u.String()
}

// createPrivate creates an empty database file with mode 0600 if none
// exists, so the file is never readable by others, not even briefly. SQLite
// gives the -wal and -shm files it creates the mode of the database file.
// An existing file is left as it is.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	// The umask cannot widen 0600, but it is applied before the mode is
	// set, so make the mode explicit rather than depend on it.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	// Make the new directory entry durable too.
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sqlite: create %s: sync directory: %w", path, err)
	}
	return nil
}

// Close closes the database. In-flight calls may fail.
func (s *SQLite) Close() error {
	s.writeMu.Lock()
	s.writeClosed = true
	for s.leading { // the batch in flight finishes first
		s.writeIdle.Wait()
	}
	s.writeMu.Unlock()
	s.r.cache.close()
	s.wstmts.close()
	if s.hub != nil {
		releaseHub(s.path)
		s.hub = nil
	}
	return errors.Join(s.r.Close(), s.w.Close())
}

// SchemaVersion returns the highest migration applied to the database.
func (s *SQLite) SchemaVersion(ctx context.Context) (int, error) {
	v, err := schemaVersion(ctx, s.r)
	if err != nil {
		return 0, fmt.Errorf("sqlite: schema version: %w", err)
	}
	return v, nil
}

// Now returns SQLite's clock, to the millisecond, in UTC.
func (s *SQLite) Now(ctx context.Context) (time.Time, error) {
	var us int64
	if err := s.r.lookup(ctx, `SELECT `+nowMicros).Scan(&us); err != nil {
		return time.Time{}, fmt.Errorf("sqlite: now: %w", err)
	}
	return time.UnixMicro(us).UTC(), nil
}

// queryer is what both *sql.DB and *sql.Tx offer for reads.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// wrap maps driver errors to the store sentinels and prefixes op.
func wrap(op string, err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlite: %s: %w", op, store.ErrNotFound)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return fmt.Errorf("sqlite: %s: %w: %v", op, store.ErrConflict, err)
		}
		// A full disk (or database size limit) is SQLITE_FULL in the
		// primary code; the write was rolled back.
		// So is a database locked past the busy timeout (another
		// process holding it: a backup, a sqlite3 shell) and an I/O
		// error of the disk: the statement did not take effect, and the
		// same request may succeed later.
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_FULL, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR:
			return fmt.Errorf("sqlite: %s: %w: %v", op, store.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
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
// nullInt is a nullable integer column (a time in Unix microseconds) that
// scans an integer or NULL without reflection: sql.NullInt64.Scan goes
// through database/sql's convertAssign, whose reflection showed in the
// authority's profile for the timestamps of every row a renewal or join
// reads. Any other value scans as sql.NullInt64 would.
type nullInt struct{ sql.NullInt64 }

func (n *nullInt) Scan(v any) error {
	switch x := v.(type) {
	case int64:
		n.Int64, n.Valid = x, true
		return nil
	case nil:
		n.Int64, n.Valid = 0, false
		return nil
	}
	return n.NullInt64.Scan(v)
}

// time is timeCol of the column.
func (n nullInt) time() time.Time { return timeCol(n.NullInt64) }

func timeCol(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64).UTC()
}
