package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// InsertCADraft records a draft's key (see store.CAStore).
func (s *SQLite) InsertCADraft(ctx context.Context, d store.CADraft) error {
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO ca_drafts (serial, role, key_ref, created_at) VALUES (?, ?, ?, `+nowMicros+`)`,
			d.Serial, d.Role, d.KeyRef); err != nil {
			return wrap("insert ca draft "+d.Serial, err)
		}
		return nil
	})
}

// ListCADrafts returns every draft, oldest first (see store.CAStore).
func (s *SQLite) ListCADrafts(ctx context.Context) ([]store.CADraft, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT serial, role, key_ref, created_at FROM ca_drafts ORDER BY created_at, serial`)
	if err != nil {
		return nil, wrap("list ca drafts", err)
	}
	defer rows.Close()
	var out []store.CADraft
	for rows.Next() {
		var (
			d       store.CADraft
			created int64
		)
		if err := rows.Scan(&d.Serial, &d.Role, &d.KeyRef, &created); err != nil {
			return nil, wrap("list ca drafts", err)
		}
		d.CreatedAt = timeCol(sql.NullInt64{Int64: created, Valid: true})
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list ca drafts", err)
	}
	return out, nil
}

// ClaimCADraft deletes a draft and returns it (see store.CAStore), with
// audit's record; writes are serialised, so of two claims the second
// finds none.
func (s *SQLite) ClaimCADraft(ctx context.Context, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) (store.CADraft, error) {
	if audit == nil {
		return store.CADraft{}, fmt.Errorf("sqlite: claim ca draft %s: no audit record: a draft is never discarded unaudited", serial)
	}
	var d store.CADraft
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var created int64
		if err := tx.QueryRowContext(ctx, `DELETE FROM ca_drafts WHERE serial = ? RETURNING serial, role, key_ref, created_at`, serial).
			Scan(&d.Serial, &d.Role, &d.KeyRef, &created); err != nil {
			return wrap("claim ca draft "+serial, err)
		}
		d.CreatedAt = timeCol(sql.NullInt64{Int64: created, Valid: true})
		return appendAuditOf(ctx, tx, "claim ca draft "+serial, audit)
	})
	if err != nil {
		return store.CADraft{}, err
	}
	return d, nil
}
