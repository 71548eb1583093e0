package postgres

import (
	"context"
	"fmt"

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
// of replicas recording at once one writes; the row never changes after,
// so reading it back tells every caller what is recorded.
func (s *Store) RecordKeyCustody(ctx context.Context, c store.KeyCustody) (store.KeyCustody, error) {
	if _, err := s.pool.Exec(ctx, `INSERT INTO key_custody (id, uri, module, recorded_at) VALUES (1, $1, $2, `+nowMicros+`)
		ON CONFLICT (id) DO NOTHING`, c.URI, c.Module); err != nil {
		return store.KeyCustody{}, wrap("record key custody", err)
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

// ClearKeyCustody removes the record of uri (see store.CustodyStore).
func (s *Store) ClearKeyCustody(ctx context.Context, uri string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM key_custody WHERE id = 1 AND uri = $1`, uri)
	if err != nil {
		return wrap("clear key custody", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: clear key custody: %s is not recorded: %w", uri, store.ErrNotFound)
	}
	return nil
}
