package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// PutSetting writes a shared setting if it is still from (see
// store.SettingStore), in one transaction of two round trips (pipe):
// BEGIN, one INSERT … ON CONFLICT DO NOTHING for the first value or one
// UPDATE conditional on the version and its write's time after, the change's notification,
// the audit link's baton (chain.go); then the audit record with COMMIT.
// A refused write, or a record that cannot be built or appended, rolls
// back both.
func (s *Store) PutSetting(ctx context.Context, st store.Setting, from store.Setting, audit func(store.AuditHead) (store.AuditRecord, error)) (store.Setting, error) {
	if audit == nil {
		return store.Setting{}, fmt.Errorf("postgres: put setting %s: no audit record: a shared setting is never changed unaudited", st.Key)
	}
	q := `UPDATE settings SET value = $1, updated_by = $2, version = version + 1, updated_at = ` + nowMicros + `
		WHERE key = $3 AND version = $4 AND updated_at = $5 RETURNING version, updated_at`
	args := []any{st.Value, st.UpdatedBy, st.Key, from.Version, from.UpdatedAt.UnixMicro()}
	if from.Version == 0 {
		q = `INSERT INTO settings (key, value, version, updated_at, updated_by) VALUES ($1, $2, 1, ` + nowMicros + `, $3)
			ON CONFLICT (key) DO NOTHING RETURNING version, updated_at`
		args = []any{st.Key, st.Value, st.UpdatedBy}
	}
	op := "put setting " + st.Key
	out := store.Setting{Key: st.Key, Value: st.Value, UpdatedBy: st.UpdatedBy}
	err := s.inPipe(ctx, op, func(p *pipe) error {
		p.row(q, args, func(row pgx.Row) error {
			var at int64
			err := row.Scan(&out.Version, &at)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("postgres: put setting %s: version %d written at %s is not the one held: %w", st.Key, from.Version, from.UpdatedAt.Format(time.RFC3339Nano), store.ErrConflict)
			}
			if err != nil {
				return wrap(op, err)
			}
			out.UpdatedAt = timeCol(&at)
			return nil
		})
		queueNotify(p, store.ChangeSettings)
		return commitAudited(ctx, p, audit, op)
	})
	if err != nil {
		return store.Setting{}, err
	}
	return out, nil
}

// Replicated is true: any number of authority replicas may share a
// PostgreSQL store.
func (s *Store) Replicated() bool { return true }
