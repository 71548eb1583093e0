package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/muster-dev/muster/internal/store"
)

// migrationFS holds the schema migrations, named NNNN_description.sql and
// numbered from 1 without gaps. A migration is never edited once released:
// changes go in a new file. They mirror the SQLite store's migrations
// number for number.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations is the parsed, ordered content of migrationFS.
var migrations = store.MustLoadMigrations(migrationFS)

// latestVersion is the schema version this binary migrates to.
func latestVersion() int { return migrations[len(migrations)-1].Version }

// migrate brings the database to latestVersion, one transaction per
// migration, holding a session advisory lock throughout: replicas starting
// together on a new database queue on the lock, and the later ones find the
// work done. Even CREATE TABLE IF NOT EXISTS races without it. created
// says the database had no schema (version 0) and this call made it.
// migrating, if not nil, hears of the migrations about to be applied;
// an error from it is returned with nothing applied.
func migrate(ctx context.Context, pool *pgxpool.Pool, migrating func(from, to int) error) (created bool, _ error) {
	return migrateWith(ctx, pool, migrations, defaultMigrationLocks, migrating)
}

// migrationLocks bounds how a migration waits for the locks its
// statements take. A migration's DDL (CREATE INDEX, DROP INDEX, ALTER
// TABLE) asks for a lock that a transaction of a running replica may
// hold; PostgreSQL queues every later request on that table behind the
// waiting one, so a migration that waits without limit beside running
// replicas (a rolling upgrade) holds up every join and renewal as long
// as the other transaction lasts. Each attempt therefore runs under
// lock_timeout: one that cannot take a lock within it rolls back,
// letting the queued requests through, and tries again after pause,
// until giveUp has passed since the first attempt.
type migrationLocks struct {
	timeout time.Duration // lock_timeout of one attempt
	pause   time.Duration // between attempts
	giveUp  time.Duration // no attempt starts after it
}

// defaultMigrationLocks keeps a request that queues behind a waiting
// migration well inside the default limits.store_timeout (10 s), and
// tries for five minutes: long enough to outlast a report query or a
// slow batch, short enough that a session left idle in a transaction
// is named to the operator instead of hanging the start.
var defaultMigrationLocks = migrationLocks{timeout: 2 * time.Second, pause: time.Second, giveUp: 5 * time.Minute}

// migrateWith is migrate with ms for the migrations and locks for their
// lock waits.
func migrateWith(ctx context.Context, pool *pgxpool.Pool, ms []store.Migration, locks migrationLocks, migrating func(from, to int) error) (created bool, _ error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("postgres: migrate: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrateLockKey); err != nil {
		return false, fmt.Errorf("postgres: migrate: lock: %w", err)
	}
	defer func() {
		// A failed unlock leaves the lock to the session's end: close it.
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrateLockKey); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER NOT NULL PRIMARY KEY,
		applied_at BIGINT  NOT NULL
	)`); err != nil {
		return false, fmt.Errorf("postgres: migrate: %w", err)
	}
	v, err := schemaVersion(ctx, conn)
	if err != nil {
		return false, fmt.Errorf("postgres: migrate: %w", err)
	}
	latest := ms[len(ms)-1].Version
	if v > latest {
		return false, &store.SchemaTooNewError{Backend: "postgres", At: v, Knows: latest}
	}
	if v < latest && migrating != nil {
		if err := migrating(v, latest); err != nil {
			return false, err
		}
	}
	for _, m := range ms[v:] {
		if err := applyRetrying(ctx, conn.Conn(), m, locks); err != nil {
			return false, err
		}
	}
	return v == 0, nil
}

// createdObjects are the tables and functions the migrations make, in an
// order DROP accepts (CASCADE drops indexes, triggers and constraints).
var (
	createTableRe    = regexp.MustCompile(`(?i)CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)`)
	createFunctionRe = regexp.MustCompile(`(?i)CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([a-z_][a-z0-9_]*)\s*\(`)
)

func createdObjects() (tables, functions []string) {
	for _, m := range migrations {
		for _, g := range createTableRe.FindAllStringSubmatch(m.SQL, -1) {
			tables = append(tables, g[1])
		}
		for _, g := range createFunctionRe.FindAllStringSubmatch(m.SQL, -1) {
			functions = append(functions, g[1])
		}
	}
	return append(tables, "schema_migrations"), functions
}

// ErrNotCreated: DropCreated on a database whose schema Open did not make.
var ErrNotCreated = errors.New("postgres: the schema was there before this store opened it; not dropped")

// Created reports whether Open found the database without muster's
// schema and made it.
func (s *Store) Created() bool { return s.created }

// DropCreated drops muster's schema (every table and function its
// migrations make, rows and all) in one transaction, returning a database
// that Open found without one (Created) to how Open found it. It is for
// muster init: an init that fails after its first writes leaves nothing
// behind, so the next one finds an empty database. ErrNotCreated if Open
// found the schema there: then nothing is dropped. The store is unusable
// afterwards.
func (s *Store) DropCreated(ctx context.Context) error {
	if !s.created {
		return ErrNotCreated
	}
	tables, functions := createdObjects()
	// Like the migrations it undoes, it may take long: only a hung
	// database is cut short.
	tx, err := s.pool.BeginTx(long(ctx), pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("postgres: drop the schema: %w", unavailable(err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for _, t := range tables {
		if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{t}.Sanitize()+` CASCADE`); err != nil {
			return fmt.Errorf("postgres: drop table %s: %w", t, unavailable(err))
		}
	}
	for _, f := range functions {
		if _, err := tx.Exec(ctx, `DROP FUNCTION IF EXISTS `+pgx.Identifier{f}.Sanitize()+`()`); err != nil {
			return fmt.Errorf("postgres: drop function %s: %w", f, unavailable(err))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: drop the schema: %w", unavailable(err))
	}
	return nil
}

// applyRetrying applies m, each attempt under locks.timeout, trying
// again while an attempt fails for a lock it could not take (55P03,
// lock_not_available) and locks.giveUp has not passed. Given up, its
// error names the migration, what it waited for and the sessions whose
// transactions are older than the lock wait, which are what hold it.
func applyRetrying(ctx context.Context, conn *pgx.Conn, m store.Migration, locks migrationLocks) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := apply(ctx, conn, m, locks.timeout)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55P03" {
			return err
		}
		if time.Since(start)+locks.pause >= locks.giveUp {
			return fmt.Errorf("postgres: migration %s: gave up after %d attempts over %s, each waiting lock_timeout %s for a lock on a table it changes (%s), held by another session: %s; end that session or its transaction (or wait for it), then start the authority again",
				m.Name, attempt, time.Since(start).Round(time.Second), locks.timeout, pe.Message, lockHolders(ctx, conn, locks.timeout))
		}
		t := time.NewTimer(locks.pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("postgres: migration %s: waiting for a lock: %w", m.Name, ctx.Err())
		case <-t.C:
		}
	}
}

// lockHolders names the sessions of this database whose transactions
// have been open longer than wait (the ones that can hold a lock a
// migration waited wait for), each with the command that ends it. Not
// their queries: one may carry a secret literal (an operator's ALTER ROLE
// ... PASSWORD), and this text is printed and logged.
func lockHolders(ctx context.Context, conn *pgx.Conn, wait time.Duration) string {
	rows, err := conn.Query(ctx, `SELECT pid, application_name, COALESCE(state, ''), EXTRACT(EPOCH FROM now() - xact_start)::bigint
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start < now() - make_interval(secs => $1)
		ORDER BY xact_start LIMIT 5`, wait.Seconds())
	if err != nil {
		return "the sessions holding it could not be listed (" + err.Error() + "): see pg_stat_activity"
	}
	var held []string
	for rows.Next() {
		var (
			pid        int32
			app, state string
			age        int64
		)
		if err := rows.Scan(&pid, &app, &state, &age); err != nil {
			rows.Close()
			return "the sessions holding it could not be listed (" + err.Error() + "): see pg_stat_activity"
		}
		held = append(held, fmt.Sprintf("pid %d (application %q, %s, transaction open %ds: end it with `psql \"$MUSTER_STORE\" -c 'SELECT pg_terminate_backend(%d)'`)",
			pid, app, state, age, pid))
	}
	if err := rows.Err(); err != nil || len(held) == 0 {
		return "no transaction older than the lock wait is open now (the one that held it has ended: start the authority again)"
	}
	return "transactions open longer than the wait: " + strings.Join(held, "; ")
}

// apply applies m in one transaction whose statements wait at most
// lockTimeout for each lock.
func apply(ctx context.Context, conn *pgx.Conn, m store.Migration, lockTimeout time.Duration) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// SET LOCAL: the session's advisory lock wait above is not bounded.
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, lockTimeout.Milliseconds())); err != nil {
		return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
	}
	v, err := schemaVersion(ctx, tx)
	if err != nil {
		return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
	}
	if v >= m.Version {
		return nil // another process got here first
	}
	if v != m.Version-1 {
		return fmt.Errorf("postgres: migration %s: database is at version %d", m.Name, v)
	}
	// No arguments: the simple protocol runs the file's several statements.
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
	}
	if _, err := tx.Exec(ctx,
		`INSERT INTO schema_migrations (version, applied_at) VALUES ($1, `+nowMicros+`)`,
		m.Version); err != nil {
		return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
	}
	return nil
}

// schemaVersion reads the highest applied migration, 0 for none.
func schemaVersion(ctx context.Context, q querier) (int, error) {
	var v int
	err := q.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}
