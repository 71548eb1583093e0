package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// InsertCADraft records a draft's key (see store.CAStore).
func (s *Store) InsertCADraft(ctx context.Context, d store.CADraft) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO ca_drafts (serial, role, key_ref, created_at) VALUES ($1, $2, $3, `+nowMicros+`)`,
		d.Serial, d.Role, d.KeyRef); err != nil {
		return wrap("insert ca draft "+d.Serial, err)
	}
	return nil
}

// ListCADrafts returns every draft, oldest first (see store.CAStore).
func (s *Store) ListCADrafts(ctx context.Context) ([]store.CADraft, error) {
	rows, err := s.pool.Query(ctx, `SELECT serial, role, key_ref, created_at FROM ca_drafts ORDER BY created_at, serial`)
	if err != nil {
		return nil, wrap("list ca drafts", err)
	}
	return collect(rows, "list ca drafts", func(row pgx.Row) (store.CADraft, error) {
		var (
			d       store.CADraft
			created int64
		)
		if err := row.Scan(&d.Serial, &d.Role, &d.KeyRef, &created); err != nil {
			return store.CADraft{}, err
		}
		d.CreatedAt = timeCol(&created)
		return d, nil
	})
}

// ClaimCADraft deletes a draft and returns it (see store.CAStore): a
// DELETE … RETURNING, so of two claims the second (waiting on the row
// lock) deletes nothing.
func (s *Store) ClaimCADraft(ctx context.Context, serial string) (store.CADraft, error) {
	var (
		d       store.CADraft
		created int64
	)
	if err := s.pool.QueryRow(ctx, `DELETE FROM ca_drafts WHERE serial = $1 RETURNING serial, role, key_ref, created_at`, serial).
		Scan(&d.Serial, &d.Role, &d.KeyRef, &created); err != nil {
		return store.CADraft{}, wrap("claim ca draft "+serial, err)
	}
	d.CreatedAt = timeCol(&created)
	return d, nil
}
