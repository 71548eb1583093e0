package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

// GetKeyCustody returns the recorded key custody (see store.CustodyStore).
func (s *SQLite) GetKeyCustody(ctx context.Context) (store.KeyCustody, error) {
	return getKeyCustody(ctx, s.r)
}

func getKeyCustody(ctx context.Context, q queryer) (store.KeyCustody, error) {
	var (
		c  store.KeyCustody
		at int64
	)
	if err := q.QueryRowContext(ctx, `SELECT uri, module, recorded_at FROM key_custody WHERE id = 1`).Scan(&c.URI, &c.Module, &at); err != nil {
		return store.KeyCustody{}, wrap("get key custody", err)
	}
	c.RecordedAt = timeCol(sql.NullInt64{Int64: at, Valid: true})
	return c, nil
}

// RecordKeyCustody records c unless a custody is recorded already (see
// store.CustodyStore), with audit's record when it writes.
func (s *SQLite) RecordKeyCustody(ctx context.Context, c store.KeyCustody, audit func(store.AuditHead) (store.AuditRecord, error)) (store.KeyCustody, error) {
	if audit == nil {
		return store.KeyCustody{}, fmt.Errorf("sqlite: record key custody %s: no audit record: a token is never recorded unaudited", c.URI)
	}
	var out store.KeyCustody
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO key_custody (id, uri, module, recorded_at) VALUES (1, ?, ?, `+nowMicros+`)
			ON CONFLICT (id) DO NOTHING`, c.URI, c.Module)
		if err != nil {
			return wrap("record key custody", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("record key custody", err)
		}
		got, err := getKeyCustody(ctx, tx)
		if err != nil {
			return err
		}
		if got.URI != c.URI {
			return fmt.Errorf("sqlite: record key custody: %s is recorded already: %w", got.URI, store.ErrConflict)
		}
		out = got
		if n == 0 {
			return nil // recorded by an earlier run: nothing changed
		}
		return appendAuditOf(ctx, tx, "record key custody "+c.URI, audit)
	})
	return out, err
}

// ClearKeyCustody removes the record of uri (see store.CustodyStore),
// with audit's record.
func (s *SQLite) ClearKeyCustody(ctx context.Context, uri string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: clear key custody %s: no audit record: a token's record is never removed unaudited", uri)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM key_custody WHERE id = 1 AND uri = ?`, uri)
		if err != nil {
			return wrap("clear key custody", err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return fmt.Errorf("sqlite: clear key custody: %s is not recorded: %w", uri, store.ErrNotFound)
		}
		return appendAuditOf(ctx, tx, "clear key custody "+uri, audit)
	})
}
