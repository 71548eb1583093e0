package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// ListSettings returns every shared setting held (see store.SettingStore).
func (s *SQLite) ListSettings(ctx context.Context) ([]store.Setting, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT key, value, version, updated_at, updated_by FROM settings ORDER BY key`)
	if err != nil {
		return nil, wrap("list settings", err)
	}
	defer rows.Close()
	var out []store.Setting
	for rows.Next() {
		var (
			st store.Setting
			at int64
		)
		if err := rows.Scan(&st.Key, &st.Value, &st.Version, &at, &st.UpdatedBy); err != nil {
			return nil, wrap("list settings", err)
		}
		st.UpdatedAt = timeCol(sql.NullInt64{Int64: at, Valid: true})
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list settings", err)
	}
	return out, nil
}

// PutSetting writes a shared setting if it is still from, version and
// time of its write, and appends its audit record, as one write of a group-committed
// transaction (see store.SettingStore): a refused write, or a record
// that cannot be built or appended, leaves both the setting and the
// chain as they were.
func (s *SQLite) PutSetting(ctx context.Context, st store.Setting, from store.Setting, audit func(store.AuditHead) (store.AuditRecord, error)) (store.Setting, error) {
	if audit == nil {
		return store.Setting{}, fmt.Errorf("sqlite: put setting %s: no audit record: a shared setting is never changed unaudited", st.Key)
	}
	q := `UPDATE settings SET value = ?, updated_by = ?, version = version + 1, updated_at = ` + nowMicros + `
		WHERE key = ? AND version = ? AND updated_at = ? RETURNING version, updated_at`
	args := []any{st.Value, st.UpdatedBy, st.Key, from.Version, from.UpdatedAt.UnixMicro()}
	if from.Version == 0 {
		q = `INSERT INTO settings (key, value, version, updated_at, updated_by) VALUES (?, ?, 1, ` + nowMicros + `, ?)
			ON CONFLICT (key) DO NOTHING RETURNING version, updated_at`
		args = []any{st.Key, st.Value, st.UpdatedBy}
	}
	out := store.Setting{Key: st.Key, Value: st.Value, UpdatedBy: st.UpdatedBy}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var at int64
		err := tx.QueryRowContext(ctx, q, args...).Scan(&out.Version, &at)
		if err == sql.ErrNoRows {
			return fmt.Errorf("sqlite: put setting %s: version %d written at %s is not the one held: %w", st.Key, from.Version, from.UpdatedAt.Format(time.RFC3339Nano), store.ErrConflict)
		}
		if err != nil {
			return wrap("put setting "+st.Key, err)
		}
		out.UpdatedAt = timeCol(sql.NullInt64{Int64: at, Valid: true})
		return appendAuditOf(ctx, tx, "put setting "+st.Key, audit)
	})
	if err != nil {
		return store.Setting{}, err
	}
	s.hub.announce(store.ChangeSettings)
	return out, nil
}

// Replicated is false: one authority process at a time uses an SQLite
// file (its data directory's lock; CheckStore refuses another
// authority's directory), beside offline commands only.
func (s *SQLite) Replicated() bool { return false }
