package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/muster-dev/muster/internal/store"
)

// migrationFS holds the schema migrations, named NNNN_description.sql and
// numbered from 1 without gaps. A migration is never edited once released:
// changes go in a new file.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations is the parsed, ordered content of migrationFS.
var migrations = mustLoadMigrations(migrationFS)

func mustLoadMigrations(fsys fs.FS) []migration {
	ms, err := loadMigrations(fsys)
	if err != nil {
		panic(err)
	}
	return ms
}

func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	// Glob returns names sorted, and the zero-padded prefix sorts by number.
	var ms []migration
	for i, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v != i+1 {
			return nil, fmt.Errorf("sqlite: migration %s: want a name starting %04d_", base, i+1)
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: base, sql: string(b)})
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("sqlite: no migrations embedded")
	}
	return ms, nil
}

// latestVersion is the schema version this binary migrates to.
func latestVersion() int { return migrations[len(migrations)-1].version }

// migrate brings the database to latestVersion, one transaction per
// migration. Each transaction begins IMMEDIATE and re-reads the version, so
// two processes opening the same new file apply each migration once.
func migrate(ctx context.Context, w *sql.DB) error {
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
		return fmt.Errorf("sqlite: database is at schema version %d, this binary knows up to %d: %w",
			v, latestVersion(), store.ErrSchemaTooNew)
	}
	for _, m := range migrations[v:] {
		if err := apply(ctx, w, m); err != nil {
			return err
		}
	}
	return nil
}

func apply(ctx context.Context, w *sql.DB, m migration) error {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.name, err)
	}
	defer tx.Rollback()
	v, err := schemaVersion(ctx, tx)
	if err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.name, err)
	}
	if v >= m.version {
		return nil // another process got here first
	}
	if v != m.version-1 {
		return fmt.Errorf("sqlite: migration %s: database is at version %d", m.name, v)
	}
	if _, err := tx.ExecContext(ctx, m.sql); err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.name, err)
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO schema_migrations (version, applied_at) VALUES (?, `+nowMicros+`)`,
		m.version); err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: migration %s: %w", m.name, err)
	}
	return nil
}

// schemaVersion reads the highest applied migration, 0 for none.
func schemaVersion(ctx context.Context, q queryer) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}
