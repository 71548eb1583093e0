package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

const caColumns = `serial, role, cert_der, key_ref, state, not_after, created_at, activated_at, retiring_at, retired_at`

// ListCACerts returns every CA certificate (see store.CAStore).
func (s *SQLite) ListCACerts(ctx context.Context) ([]store.CACert, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+caColumns+` FROM ca_certs ORDER BY role, created_at, serial`)
	if err != nil {
		return nil, wrap("list ca certs", err)
	}
	defer rows.Close()
	var out []store.CACert
	for rows.Next() {
		var (
			c                            store.CACert
			notAfter, created            int64
			activated, retiring, retired sql.NullInt64
		)
		if err := rows.Scan(&c.Serial, &c.Role, &c.CertDER, &c.KeyRef, &c.State, &notAfter, &created, &activated, &retiring, &retired); err != nil {
			return nil, wrap("list ca certs", err)
		}
		c.NotAfter = timeCol(sql.NullInt64{Int64: notAfter, Valid: true})
		c.CreatedAt = timeCol(sql.NullInt64{Int64: created, Valid: true})
		c.ActivatedAt, c.RetiringAt, c.RetiredAt = timeCol(activated), timeCol(retiring), timeCol(retired)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list ca certs", err)
	}
	return out, nil
}

// InsertCACert adds a prepared or active CA certificate (see
// store.CAStore); the partial unique indexes keep one of each per role.
func (s *SQLite) InsertCACert(ctx context.Context, c store.CACert, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if c.State != store.CAPrepared && c.State != store.CAActive {
		return fmt.Errorf("sqlite: insert ca cert %s: state %q: want prepared or active", c.Serial, c.State)
	}
	if audit == nil {
		return fmt.Errorf("sqlite: insert ca cert %s: no audit record: an intermediate is never stored unaudited", c.Serial)
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		if err := insertCACert(ctx, tx, c); err != nil {
			return err
		}
		return appendAuditOf(ctx, tx, "insert ca cert "+c.Serial, audit)
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeCA)
	return nil
}

func insertCACert(ctx context.Context, tx *writeTx, c store.CACert) error {
	q := `INSERT INTO ca_certs (` + caColumns + `) VALUES (?, ?, ?, ?, ?, ?, COALESCE(?, ` + nowMicros + `),
		COALESCE(?, CASE WHEN ? = 'active' THEN ` + nowMicros + ` END), NULL, NULL)`
	args := []any{c.Serial, c.Role, c.CertDER, c.KeyRef, c.State, c.NotAfter.UnixMicro(), timeArg(c.CreatedAt), timeArg(c.ActivatedAt), c.State}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return wrap("insert ca cert "+c.Serial, err)
	}
	return nil
}

// PrepareFromCADraft stores c and deletes its draft (see store.CAStore),
// inside one write transaction.
func (s *SQLite) PrepareFromCADraft(ctx context.Context, c store.CACert, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "prepare ca cert " + c.Serial + " from its draft"
	if c.State != store.CAPrepared {
		return fmt.Errorf("sqlite: %s: state %q: want prepared", op, c.State)
	}
	if audit == nil {
		return fmt.Errorf("sqlite: %s: no audit record: an intermediate is never stored unaudited", op)
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM ca_drafts WHERE serial = ? AND role = ? AND key_ref = ?`, c.Serial, c.Role, c.KeyRef)
		if err != nil {
			return wrap(op, err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return fmt.Errorf("sqlite: %s: no such draft: %w", op, store.ErrNotFound)
		}
		if err := insertCACert(ctx, tx, c); err != nil {
			return err
		}
		return appendAuditOf(ctx, tx, op, audit)
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeCA)
	return nil
}

// ActivateCACert makes a prepared certificate active and the active one
// retiring (see store.CAStore), inside one write transaction.
func (s *SQLite) ActivateCACert(ctx context.Context, role, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: activate ca cert %s: no audit record: an intermediate is never activated unaudited", serial)
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var state string
		if err := tx.QueryRowContext(ctx, `SELECT state FROM ca_certs WHERE serial = ? AND role = ?`, serial, role).Scan(&state); err != nil || state != store.CAPrepared {
			return fmt.Errorf("sqlite: activate ca cert %s: not the prepared %s certificate: %w", serial, role, store.ErrConflict)
		}
		// The old one steps down first: one active per role is an index.
		if _, err := tx.ExecContext(ctx, `UPDATE ca_certs SET state = 'retiring', retiring_at = `+nowMicros+` WHERE role = ? AND state = 'active'`, role); err != nil {
			return wrap("activate ca cert: retire the active one", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE ca_certs SET state = 'active', activated_at = `+nowMicros+` WHERE serial = ? AND state = 'prepared'`, serial); err != nil {
			return wrap("activate ca cert "+serial, err)
		}
		return appendAuditOf(ctx, tx, "activate ca cert "+serial, audit)
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeCA)
	return nil
}

// RetireCACert moves a retiring certificate to retired, returning its key
// reference (see store.CAStore).
func (s *SQLite) RetireCACert(ctx context.Context, role, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error) {
	return s.endCACert(ctx, "retire ca cert", role, serial, store.CARetiring, audit)
}

// endCACert retires serial of role from state from inside one write
// transaction (writes are serialised, so of two ending it the second
// finds it retired and conflicts), with audit's record. It returns the
// key reference, which stays until DropCAKey.
func (s *SQLite) endCACert(ctx context.Context, op, role, serial, from string, audit func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error) {
	if audit == nil {
		return nil, fmt.Errorf("sqlite: %s %s: no audit record: an intermediate is never ended unaudited", op, serial)
	}
	var ref []byte
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var state string
		err := tx.QueryRowContext(ctx, `SELECT state, key_ref FROM ca_certs WHERE serial = ? AND role = ?`, serial, role).Scan(&state, &ref)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return wrap(op+" "+serial, err)
		}
		if state != from {
			return fmt.Errorf("sqlite: %s %s: not a %s %s certificate: %w", op, serial, from, role, store.ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE ca_certs SET state = 'retired', retired_at = `+nowMicros+` WHERE serial = ?`, serial); err != nil {
			return wrap(op+" "+serial, err)
		}
		return appendAuditOf(ctx, tx, op+" "+serial, audit)
	})
	if err != nil {
		return nil, err
	}
	s.hub.announce(store.ChangeCA)
	return ref, nil
}

// DropCAKey empties a retired certificate's key reference once its key is
// destroyed (see store.CAStore), with audit's record.
func (s *SQLite) DropCAKey(ctx context.Context, serial string, ref []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "drop ca key " + serial
	if audit == nil {
		return fmt.Errorf("sqlite: %s: no audit record: a key reference is never dropped unaudited", op)
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `UPDATE ca_certs SET key_ref = NULL WHERE serial = ? AND state = 'retired' AND key_ref = ?`, serial, ref)
		if err != nil {
			return wrap(op, err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return fmt.Errorf("sqlite: %s: not retired with that key reference: %w", op, store.ErrConflict)
		}
		return appendAuditOf(ctx, tx, op, audit)
	})
}
