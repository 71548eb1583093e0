package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// migrationFS holds the schema migrations, named NNNN_description.sql and
// numbered from 1 without gaps. A migration is never edited once released:
// changes go in a new file.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations is the parsed, ordered content of migrationFS.
var migrations = store.MustLoadMigrations(migrationFS)

// latestVersion is the schema version this binary migrates to.
func latestVersion() int { return migrations[len(migrations)-1].Version }

// LatestSchemaVersion is the schema version this binary migrates a
// database to and opens at most, the same for both backends (their
// migrations mirror each other): muster version shows it.
func LatestSchemaVersion() int { return latestVersion() }

// migrate brings the database to latestVersion, one transaction per
// migration. Each transaction begins IMMEDIATE and re-reads the version, so
// two processes opening the same new file apply each migration once.
// migrating, if not nil, hears of the migrations about to be applied;
// an error from it is returned with nothing applied.
func migrate(ctx context.Context, w *sql.DB, migrating func(from, to int) error) error {
	if _, err := w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER NOT NULL PRIMARY KEY,
		applied_at INTEGER NOT NULL
	) STRICT`); err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	v, err := schemaVersion(ctx, w)
	if err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	if v > latestVersion() {
		return &store.SchemaTooNewError{Backend: "sqlite", At: v, Knows: latestVersion()}
	}
	if v < latestVersion() && migrating != nil {
		if err := migrating(v, latestVersion()); err != nil {
			return err
		}
	}
	for _, m := range migrations[v:] {
		if err := apply(ctx, w, m); err != nil {
			return err
		}
	}
	return nil
}

func apply(ctx context.Context, w *sql.DB, m store.Migration) error {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.Name, err)
	}
	defer tx.Rollback()
	v, err := schemaVersion(ctx, tx)
	if err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.Name, err)
	}
	if v >= m.Version {
		return nil // another process got here first
	}
	if v != m.Version-1 {
		return fmt.Errorf("sqlite: migration %s: database is at version %d", m.Name, v)
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.Name, err)
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO schema_migrations (version, applied_at) VALUES (?, `+nowMicros+`)`,
		m.Version); err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.Name, err)
	}
	return nil
}

// schemaVersion reads the highest applied migration, 0 for none.
func schemaVersion(ctx context.Context, q queryer) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}
