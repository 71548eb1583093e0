package postgres

import (
	"context"
	"embed"
	"fmt"

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
// work done. Even CREATE TABLE IF NOT EXISTS races without it.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrateLockKey); err != nil {
		return fmt.Errorf("postgres: migrate: lock: %w", err)
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
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	v, err := schemaVersion(ctx, conn)
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	if v > latestVersion() {
		return fmt.Errorf("postgres: database is at schema version %d, this binary knows up to %d: %w",
			v, latestVersion(), store.ErrSchemaTooNew)
	}
	for _, m := range migrations[v:] {
		if err := apply(ctx, conn.Conn(), m); err != nil {
			return err
		}
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
