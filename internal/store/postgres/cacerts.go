package postgres

import (
	"context"
	"errors"
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
// One pipe: the INSERT, the notification and the audit link, then the
// record with COMMIT; a record that cannot be built or appended rolls the
// certificate back.
func (s *Store) InsertCACert(ctx context.Context, c store.CACert, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if c.State != store.CAPrepared && c.State != store.CAActive {
		return fmt.Errorf("postgres: insert ca cert %s: state %q: want prepared or active", c.Serial, c.State)
	}
	op := "insert ca cert " + c.Serial
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: an intermediate is never stored unaudited", op)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		queueInsertCACert(p, c, op)
		queueNotify(p, store.ChangeCA)
		return commitAudited(ctx, p, audit, op)
	})
}

func queueInsertCACert(p *pipe, c store.CACert, op string) {
	p.exec(`INSERT INTO ca_certs (`+caColumns+`) VALUES ($1, $2, $3, $4, $5, $6, COALESCE($7, `+nowMicros+`),
		COALESCE($8, CASE WHEN $5 = 'active' THEN `+nowMicros+` END), NULL, NULL)`,
		[]any{c.Serial, c.Role, c.CertDER, c.KeyRef, c.State, c.NotAfter.UnixMicro(), timeArg(c.CreatedAt), timeArg(c.ActivatedAt)}, wrapped(op))
}

// ActivateCACert makes a prepared certificate active and the active one
// retiring (see store.CAStore) in one READ COMMITTED transaction, with
// its audit record: the prepared row is locked first, so of two
// activations the second waits, then finds it active and conflicts.
func (s *Store) ActivateCACert(ctx context.Context, role, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "activate ca cert " + serial
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: an intermediate is never activated unaudited", op)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		var state string
		p.row(`SELECT state FROM ca_certs WHERE serial = $1 AND role = $2 FOR UPDATE`, []any{serial, role}, func(row pgx.Row) error {
			if err := row.Scan(&state); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return wrap(op, err)
			}
			return nil
		})
		if err := p.send(ctx); err != nil {
			return err
		}
		if state != store.CAPrepared {
			return fmt.Errorf("postgres: activate ca cert %s: not the prepared %s certificate: %w", serial, role, store.ErrConflict)
		}
		// The old one steps down first: one active per role is an index.
		p.exec(`UPDATE ca_certs SET state = 'retiring', retiring_at = `+nowMicros+` WHERE role = $1 AND state = 'active'`, []any{role},
			wrapped("activate ca cert: retire the active one"))
		p.exec(`UPDATE ca_certs SET state = 'active', activated_at = `+nowMicros+` WHERE serial = $1 AND state = 'prepared'`, []any{serial}, wrapped(op))
		queueNotify(p, store.ChangeCA)
		return commitAudited(ctx, p, audit, op)
	})
}

// RetireCACert moves a retiring certificate to retired, returning its key
// reference (see store.CAStore).
func (s *Store) RetireCACert(ctx context.Context, role, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error) {
	return s.endCACert(ctx, "retire ca cert", role, serial, store.CARetiring, audit)
}

// endCACert retires serial of role from state from, in one READ
// COMMITTED transaction with audit's record: the
// row is locked first, so of two replicas ending it the second waits,
// then finds it retired and conflicts. It returns the key reference,
// which stays until DropCAKey.
func (s *Store) endCACert(ctx context.Context, op, role, serial, from string, audit func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error) {
	if audit == nil {
		return nil, fmt.Errorf("postgres: %s %s: no audit record: an intermediate is never ended unaudited", op, serial)
	}
	var ref []byte
	err := s.inPipe(ctx, op+" "+serial, func(p *pipe) error {
		var state string
		p.row(`SELECT state, key_ref FROM ca_certs WHERE serial = $1 AND role = $2 FOR UPDATE`, []any{serial, role}, func(row pgx.Row) error {
			if err := row.Scan(&state, &ref); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return wrap(op+" "+serial, err)
			}
			return nil
		})
		if err := p.send(ctx); err != nil {
			return err
		}
		if state != from {
			return fmt.Errorf("postgres: %s %s: not a %s %s certificate: %w", op, serial, from, role, store.ErrConflict)
		}
		p.exec(`UPDATE ca_certs SET state = 'retired', retired_at = `+nowMicros+` WHERE serial = $1`, []any{serial}, wrapped(op+" "+serial))
		queueNotify(p, store.ChangeCA)
		return commitAudited(ctx, p, audit, op+" "+serial)
	})
	if err != nil {
		return nil, err
	}
	return ref, nil
}

// DropCAKey empties a retired certificate's key reference once its key is
// destroyed (see store.CAStore): one conditional UPDATE with audit's
// record; of two replicas the second waits on the row, then matches
// nothing.
func (s *Store) DropCAKey(ctx context.Context, serial string, ref []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "drop ca key " + serial
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: a key reference is never dropped unaudited", op)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`UPDATE ca_certs SET key_ref = NULL WHERE serial = $1 AND state = 'retired' AND key_ref = $2`, []any{serial, ref},
			wrappedOne(op, fmt.Errorf("postgres: %s: not retired with that key reference: %w", op, store.ErrConflict)))
		return commitAudited(ctx, p, audit, op)
	})
}
