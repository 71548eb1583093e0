package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const caColumns = `serial, role, cert_der, key_ref, state, not_after, created_at, activated_at, retiring_at, retired_at`

// ListCACerts returns every CA certificate (see store.CAStore).
func (s *Store) ListCACerts(ctx context.Context) ([]store.CACert, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+caColumns+` FROM ca_certs ORDER BY role, created_at, serial`)
	if err != nil {
		return nil, wrap("list ca certs", err)
	}
	return collect(rows, "list ca certs", func(row pgx.Row) (store.CACert, error) {
		var (
			c                            store.CACert
			notAfter, created            int64
			activated, retiring, retired *int64
		)
		if err := row.Scan(&c.Serial, &c.Role, &c.CertDER, &c.KeyRef, &c.State, &notAfter, &created, &activated, &retiring, &retired); err != nil {
			return store.CACert{}, err
		}
		c.NotAfter, c.CreatedAt = timeCol(&notAfter), timeCol(&created)
		c.ActivatedAt, c.RetiringAt, c.RetiredAt = timeCol(activated), timeCol(retiring), timeCol(retired)
		return c, nil
	})
}

// InsertCACert adds a prepared or active CA certificate (see
// store.CAStore); the partial unique indexes keep one of each per role.
func (s *Store) InsertCACert(ctx context.Context, c store.CACert) error {
	if c.State != store.CAPrepared && c.State != store.CAActive {
		return fmt.Errorf("postgres: insert ca cert %s: state %q: want prepared or active", c.Serial, c.State)
	}
	return s.inTx(ctx, "insert ca cert", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ca_certs (`+caColumns+`) VALUES ($1, $2, $3, $4, $5, $6, COALESCE($7, `+nowMicros+`),
			COALESCE($8, CASE WHEN $5 = 'active' THEN `+nowMicros+` END), NULL, NULL)`,
			c.Serial, c.Role, c.CertDER, c.KeyRef, c.State, c.NotAfter.UnixMicro(), timeArg(c.CreatedAt), timeArg(c.ActivatedAt)); err != nil {
			return wrap("insert ca cert "+c.Serial, err)
		}
		return notifyTx(ctx, tx, store.ChangeCA)
	})
}

// ActivateCACert makes a prepared certificate active and the active one
// retiring (see store.CAStore) in one READ COMMITTED transaction: the
// prepared row is locked first, so of two activations the second waits,
// then finds it active and conflicts.
func (s *Store) ActivateCACert(ctx context.Context, role, serial string) error {
	return s.inTx(ctx, "activate ca cert", func(tx pgx.Tx) error {
		var state string
		err := tx.QueryRow(ctx, `SELECT state FROM ca_certs WHERE serial = $1 AND role = $2 FOR UPDATE`, serial, role).Scan(&state)
		if err != nil && err != pgx.ErrNoRows {
			return wrap("activate ca cert "+serial, err)
		}
		if state != store.CAPrepared {
			return fmt.Errorf("postgres: activate ca cert %s: not the prepared %s certificate: %w", serial, role, store.ErrConflict)
		}
		// The old one steps down first: one active per role is an index.
		if _, err := tx.Exec(ctx, `UPDATE ca_certs SET state = 'retiring', retiring_at = `+nowMicros+` WHERE role = $1 AND state = 'active'`, role); err != nil {
			return wrap("activate ca cert: retire the active one", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE ca_certs SET state = 'active', activated_at = `+nowMicros+` WHERE serial = $1 AND state = 'prepared'`, serial); err != nil {
			return wrap("activate ca cert "+serial, err)
		}
		return notifyTx(ctx, tx, store.ChangeCA)
	})
}

// RetireCACert moves a retiring certificate to retired and clears its
// key reference, returning it (see store.CAStore).
func (s *Store) RetireCACert(ctx context.Context, role, serial string) ([]byte, error) {
	return s.endCACert(ctx, "retire ca cert", role, serial, store.CARetiring)
}

// endCACert retires serial of role from state from, clearing its key
// reference, in one READ COMMITTED transaction: the row is locked first,
// so of two replicas ending it the second waits, then finds it retired
// and conflicts. It returns the reference cleared.
func (s *Store) endCACert(ctx context.Context, op, role, serial, from string) ([]byte, error) {
	var ref []byte
	err := s.inTx(ctx, op, func(tx pgx.Tx) error {
		var state string
		err := tx.QueryRow(ctx, `SELECT state, key_ref FROM ca_certs WHERE serial = $1 AND role = $2 FOR UPDATE`, serial, role).Scan(&state, &ref)
		if err != nil && err != pgx.ErrNoRows {
			return wrap(op+" "+serial, err)
		}
		if state != from {
			return fmt.Errorf("postgres: %s %s: not a %s %s certificate: %w", op, serial, from, role, store.ErrConflict)
		}
		if _, err := tx.Exec(ctx, `UPDATE ca_certs SET state = 'retired', retired_at = `+nowMicros+`, key_ref = NULL WHERE serial = $1`, serial); err != nil {
			return wrap(op+" "+serial, err)
		}
		return notifyTx(ctx, tx, store.ChangeCA)
	})
	if err != nil {
		return nil, err
	}
	return ref, nil
}
