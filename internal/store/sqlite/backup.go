package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
)

// BackupInto writes one consistent snapshot of the database at src into
// dst with VACUUM INTO, while other connections (a running authority)
// read and write it: the snapshot is what one read transaction sees, and
// in WAL mode it blocks no writer. dst must exist and be empty (SQLite
// refuses to write into a database), so that the caller creates it with
// the mode it wants before a byte of the store is in it; SQLite keeps
// that mode.
func BackupInto(ctx context.Context, src, dst string) error {
	abs, err := filepath.Abs(src)
	if err != nil {
		return fmt.Errorf("sqlite: %w", err)
	}
	// Read-only: the backup never writes to the store, not even its
	// schema, whatever version this binary knows.
	db, err := sql.Open("sqlite", dsn(abs, url.Values{
		"mode":    {"ro"},
		"_pragma": {fmt.Sprintf("busy_timeout(%d)", busyTimeoutMS)},
	}))
	if err != nil {
		return fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, dst); err != nil {
		return wrap("backup "+abs, err)
	}
	return nil
}

// CheckBackup opens the database at path read-only, as a backup that
// nothing else opens, and checks it: PRAGMA integrity_check, and the
// schema version it is at (0: no schema).
func CheckBackup(ctx context.Context, path string) (schema int, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return 0, fmt.Errorf("sqlite: %w", err)
	}
	// immutable: no -shm or -wal beside the backup is made or read; the
	// snapshot VACUUM INTO wrote is whole in the one file.
	db, err := sql.Open("sqlite", dsn(abs, url.Values{"mode": {"ro"}, "immutable": {"1"}}))
	if err != nil {
		return 0, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `PRAGMA integrity_check`)
	if err != nil {
		return 0, wrap("check "+abs, err)
	}
	var problems []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return 0, wrap("check "+abs, err)
		}
		if s != "ok" {
			problems = append(problems, s)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, wrap("check "+abs, err)
	}
	if len(problems) > 0 {
		return 0, fmt.Errorf("sqlite: %s fails its integrity check: %v", abs, problems)
	}
	v, err := schemaVersion(ctx, db)
	if err != nil {
		return 0, wrap("schema version of "+abs, err)
	}
	return v, nil
}
