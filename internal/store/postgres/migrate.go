package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
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
	if v > latestVersion() {
		return false, &store.SchemaTooNewError{Backend: "postgres", At: v, Knows: latestVersion()}
	}
	if v < latestVersion() && migrating != nil {
		if err := migrating(v, latestVersion()); err != nil {
			return false, err
		}
	}
	for _, m := range migrations[v:] {
		if err := apply(ctx, conn.Conn(), m); err != nil {
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

func apply(ctx context.Context, conn *pgx.Conn, m store.Migration) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
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
