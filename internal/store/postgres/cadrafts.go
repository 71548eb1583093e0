package postgres

import (
	"context"
	"fmt"

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

// ClaimCADraft deletes a draft and returns it (see store.CAStore), with
// audit's record: a DELETE … RETURNING, so of two claims the second
// (waiting on the row lock) deletes nothing.
func (s *Store) ClaimCADraft(ctx context.Context, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) (store.CADraft, error) {
	op := "claim ca draft " + serial
	if audit == nil {
		return store.CADraft{}, fmt.Errorf("postgres: %s: no audit record: a draft is never discarded unaudited", op)
	}
	var (
		d       store.CADraft
		created int64
	)
	err := s.inPipe(ctx, op, func(p *pipe) error {
		p.row(`DELETE FROM ca_drafts WHERE serial = $1 RETURNING serial, role, key_ref, created_at`, []any{serial}, func(row pgx.Row) error {
			if err := row.Scan(&d.Serial, &d.Role, &d.KeyRef, &created); err != nil {
				return wrap(op, err)
			}
			return nil
		})
		return commitAudited(ctx, p, audit, op)
	})
	if err != nil {
		return store.CADraft{}, err
	}
	d.CreatedAt = timeCol(&created)
	return d, nil
}

// PrepareFromCADraft stores c and deletes its draft (see store.CAStore)
// in one READ COMMITTED transaction with audit's record: the DELETE
// locks the draft's row, so of a prepare and a claim the second waits,
// then finds no draft.
func (s *Store) PrepareFromCADraft(ctx context.Context, c store.CACert, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "prepare ca cert " + c.Serial + " from its draft"
	if c.State != store.CAPrepared {
		return fmt.Errorf("postgres: %s: state %q: want prepared", op, c.State)
	}
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: an intermediate is never stored unaudited", op)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`DELETE FROM ca_drafts WHERE serial = $1 AND role = $2 AND key_ref = $3`, []any{c.Serial, c.Role, c.KeyRef},
			wrappedOne(op, fmt.Errorf("postgres: %s: no such draft: %w", op, store.ErrNotFound)))
		if err := p.send(ctx); err != nil {
			return err
		}
		queueInsertCACert(p, c, op)
		queueNotify(p, store.ChangeCA)
		return commitAudited(ctx, p, audit, op)
	})
}
