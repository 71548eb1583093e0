package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// ListSettings returns every shared setting held (see store.SettingStore).
func (s *Store) ListSettings(ctx context.Context) ([]store.Setting, error) {
	rows, err := s.pool.Query(ctx, `SELECT key, value, version, updated_at, updated_by FROM settings ORDER BY key`)
	if err != nil {
		return nil, wrap("list settings", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Setting, error) {
		var (
			st store.Setting
			at int64
		)
		err := row.Scan(&st.Key, &st.Value, &st.Version, &at, &st.UpdatedBy)
		st.UpdatedAt = timeCol(&at)
		return st, err
	})
	if err != nil {
		return nil, wrap("list settings", err)
	}
	return out, nil
}

// PutSetting writes a shared setting if its version is still from (see
// store.SettingStore): one INSERT … ON CONFLICT DO NOTHING for the first
// value, one UPDATE conditional on the version after, and the change's
// notification in the same transaction.
func (s *Store) PutSetting(ctx context.Context, st store.Setting, from int64) (store.Setting, error) {
	q := `UPDATE settings SET value = $1, updated_by = $2, version = version + 1, updated_at = ` + nowMicros + `
		WHERE key = $3 AND version = $4 RETURNING version, updated_at`
	args := []any{st.Value, st.UpdatedBy, st.Key, from}
	if from == 0 {
		q = `INSERT INTO settings (key, value, version, updated_at, updated_by) VALUES ($1, $2, 1, ` + nowMicros + `, $3)
			ON CONFLICT (key) DO NOTHING RETURNING version, updated_at`
		args = []any{st.Key, st.Value, st.UpdatedBy}
	}
	out := store.Setting{Key: st.Key, Value: st.Value, UpdatedBy: st.UpdatedBy}
	err := s.inTx(ctx, "put setting "+st.Key, func(tx pgx.Tx) error {
		var at int64
		err := tx.QueryRow(ctx, q, args...).Scan(&out.Version, &at)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("postgres: put setting %s: version %d is not the one held: %w", st.Key, from, store.ErrConflict)
		}
		if err != nil {
			return wrap("put setting "+st.Key, err)
		}
		out.UpdatedAt = timeCol(&at)
		return notifyTx(ctx, tx, store.ChangeSettings)
	})
	if err != nil {
		return store.Setting{}, err
	}
	return out, nil
}

// Replicated is true: any number of authority replicas may share a
// PostgreSQL store.
func (s *Store) Replicated() bool { return true }
