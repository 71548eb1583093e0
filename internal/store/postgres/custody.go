package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// GetKeyCustody returns the recorded key custody (see store.CustodyStore).
func (s *Store) GetKeyCustody(ctx context.Context) (store.KeyCustody, error) {
	var (
		c  store.KeyCustody
		at int64
	)
	if err := s.pool.QueryRow(ctx, `SELECT uri, module, recorded_at FROM key_custody WHERE id = 1`).Scan(&c.URI, &c.Module, &at); err != nil {
		return store.KeyCustody{}, wrap("get key custody", err)
	}
	c.RecordedAt = timeCol(&at)
	return c, nil
}

// RecordKeyCustody records c unless a custody is recorded already (see
// store.CustodyStore): one INSERT that does nothing on the row's key, so
// of replicas recording at once one writes (the others wait on the row
// and insert nothing), with audit's record when it writes; the row
// never changes after, so reading it back tells every caller what is
// recorded.
func (s *Store) RecordKeyCustody(ctx context.Context, c store.KeyCustody, audit func(store.AuditHead) (store.AuditRecord, error)) (store.KeyCustody, error) {
	if audit == nil {
		return store.KeyCustody{}, fmt.Errorf("postgres: record key custody %s: no audit record: a token is never recorded unaudited", c.URI)
	}
	op := "record key custody " + c.URI
	var inserted bool
	err := s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`INSERT INTO key_custody (id, uri, module, recorded_at) VALUES (1, $1, $2, `+nowMicros+`)
			ON CONFLICT (id) DO NOTHING`, []any{c.URI, c.Module}, func(tag pgconn.CommandTag, err error) error {
			if err != nil {
				return wrap(op, err)
			}
			inserted = tag.RowsAffected() == 1
			return nil
		})
		if err := p.send(ctx); err != nil {
			return err
		}
		if !inserted {
			return nil // recorded already: nothing to commit, the read below says by whom
		}
		return commitAudited(ctx, p, audit, op)
	})
	if err != nil {
		return store.KeyCustody{}, err
	}
	got, err := s.GetKeyCustody(ctx)
	if err != nil {
		return store.KeyCustody{}, err
	}
	if got.URI != c.URI {
		return store.KeyCustody{}, fmt.Errorf("postgres: record key custody: %s is recorded already: %w", got.URI, store.ErrConflict)
	}
	return got, nil
}

// ClearKeyCustody removes the record of uri (see store.CustodyStore),
// with audit's record.
func (s *Store) ClearKeyCustody(ctx context.Context, uri string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("postgres: clear key custody %s: no audit record: a token's record is never removed unaudited", uri)
	}
	op := "clear key custody " + uri
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`DELETE FROM key_custody WHERE id = 1 AND uri = $1`, []any{uri},
			wrappedOne(op, fmt.Errorf("postgres: clear key custody: %s is not recorded: %w", uri, store.ErrNotFound)))
		return commitAudited(ctx, p, audit, op)
	})
}
