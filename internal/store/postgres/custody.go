package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

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
// and insert nothing), with audit's record when it writes. What is
// recorded is read inside the transaction, never after it: the INSERT's
// RETURNING when it wrote, else a SELECT of its own (a new statement's
// snapshot sees the row whose insert this one waited on). A read after
// the commit could find the custody cleared and another recorded
// meanwhile (ClearKeyCustody, from another replica), and report a
// conflict for a record that was made.
func (s *Store) RecordKeyCustody(ctx context.Context, c store.KeyCustody, audit func(store.AuditHead) (store.AuditRecord, error)) (store.KeyCustody, error) {
	if audit == nil {
		return store.KeyCustody{}, fmt.Errorf("postgres: record key custody %s: no audit record: a token is never recorded unaudited", c.URI)
	}
	op := "record key custody " + c.URI
	var (
		got store.KeyCustody
		at  int64
	)
	scan := func(found *bool) func(pgx.Row) error {
		return func(row pgx.Row) error {
			err := row.Scan(&got.URI, &got.Module, &at)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return wrap(op, err)
			}
			*found = true
			return nil
		}
	}
	err := s.inPipe(ctx, op, func(p *pipe) error {
		// A record cleared between the INSERT that found it and the
		// SELECT that reads it is gone: the INSERT is tried again.
		for range 3 {
			var inserted, found bool
			p.row(`INSERT INTO key_custody (id, uri, module, recorded_at) VALUES (1, $1, $2, `+nowMicros+`)
				ON CONFLICT (id) DO NOTHING RETURNING uri, module, recorded_at`, []any{c.URI, c.Module}, scan(&inserted))
			if err := p.send(ctx); err != nil {
				return err
			}
			if inserted {
				return commitAudited(ctx, p, audit, op)
			}
			p.row(`SELECT uri, module, recorded_at FROM key_custody WHERE id = 1`, nil, scan(&found))
			if err := p.send(ctx); err != nil {
				return err
			}
			if found {
				return nil // recorded already: nothing to commit
			}
		}
		return fmt.Errorf("postgres: %s: the recorded custody was cleared and recorded again while this was recording: %w", op, store.ErrConflict)
	})
	if err != nil {
		return store.KeyCustody{}, err
	}
	got.RecordedAt = timeCol(&at)
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
