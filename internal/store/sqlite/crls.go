package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// revokedQuery drives every branch from a small set (the locks in force,
// the recently deleted instances) into the record of issuance by an index:
// certificates by node, instance and public key, operators by name.
const revokedQuery = `WITH l AS (SELECT kind, target, created_at FROM locks
		WHERE kind IN ('node', 'instance', 'public_key', 'admin') AND ` + unexpired + `)
	SELECT c.serial, c.not_before, c.not_after, 0, l.kind, l.created_at
		FROM l JOIN certificates c ON c.node_id = l.target
		WHERE l.kind = 'node' AND c.not_after > ` + nowMicros + `
	UNION ALL
	SELECT c.serial, c.not_before, c.not_after, 0, l.kind, l.created_at
		FROM l JOIN certificates c ON c.instance_id = l.target
		WHERE l.kind = 'instance' AND c.not_after > ` + nowMicros + `
	UNION ALL
	SELECT c.serial, c.not_before, c.not_after, 0, l.kind, l.created_at
		FROM l JOIN certificates c ON c.public_key = unhex(l.target)
		WHERE l.kind = 'public_key' AND c.not_after > ` + nowMicros + `
	UNION ALL
	SELECT o.serial, o.not_before, o.not_after, 1, l.kind, l.created_at
		FROM l JOIN operators o ON o.name = l.target
		WHERE l.kind = 'admin' AND o.not_after > ` + nowMicros + `
	UNION ALL
	SELECT c.serial, c.not_before, c.not_after, 0, 'deleted', NULL
		FROM instances i JOIN certificates c ON c.instance_id = i.id
		WHERE i.state = 'deleted' AND i.last_issued_at > ? AND c.not_after > ` + nowMicros

// ListRevokedCertificates returns the unexpired certificates of locked
// nodes, instances, public keys and operators and of deleted nodes, in one
// query (see store.CRLStore).
func (s *SQLite) ListRevokedCertificates(ctx context.Context, issuedAfter time.Time) ([]store.RevokedCertificate, error) {
	rows, err := s.r.QueryContext(ctx, revokedQuery, issuedAfter.UnixMicro())
	if err != nil {
		return nil, wrap("list revoked certificates", err)
	}
	return collect(rows, "list revoked certificates", func(r scanner) (store.RevokedCertificate, error) {
		var (
			c                          store.RevokedCertificate
			notBefore, notAfter, since sql.NullInt64
		)
		if err := r.Scan(&c.Serial, &notBefore, &notAfter, &c.Operator, &c.Reason, &since); err != nil {
			return c, err
		}
		c.NotBefore, c.NotAfter, c.Since = timeCol(notBefore), timeCol(notAfter), timeCol(since)
		return c, nil
	})
}

// GetCRL returns the stored list of issuer; ErrNotFound.
func (s *SQLite) GetCRL(ctx context.Context, issuer string) (store.CRL, error) {
	c := store.CRL{Issuer: issuer}
	var thisUpdate, nextUpdate sql.NullInt64
	err := s.r.QueryRowContext(ctx, `SELECT number, this_update, next_update, digest, der FROM crls WHERE issuer = ?`, issuer).
		Scan(&c.Number, &thisUpdate, &nextUpdate, &c.Digest, &c.DER)
	if err != nil {
		return store.CRL{}, wrap("get crl "+issuer, err)
	}
	c.ThisUpdate, c.NextUpdate = timeCol(thisUpdate), timeCol(nextUpdate)
	return c, nil
}

// PutCRL stores c if the stored list of its issuer is prev, its number
// and this update (number 0: none); ErrConflict otherwise. One statement:
// the insert or the update conditional on the list read.
func (s *SQLite) PutCRL(ctx context.Context, c store.CRL, prev store.CRL) error {
	if c.Number <= prev.Number {
		return fmt.Errorf("sqlite: put crl %s: %w: number %d does not follow %d", c.Issuer, store.ErrConflict, c.Number, prev.Number)
	}
	var (
		res sql.Result
		err error
	)
	if prev.Number == 0 {
		res, err = s.w.ExecContext(ctx, `INSERT INTO crls (issuer, number, this_update, next_update, digest, der)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (issuer) DO NOTHING`,
			c.Issuer, c.Number, timeArg(c.ThisUpdate), timeArg(c.NextUpdate), c.Digest, c.DER)
	} else {
		res, err = s.w.ExecContext(ctx, `UPDATE crls SET number = ?, this_update = ?, next_update = ?, digest = ?, der = ?
			WHERE issuer = ? AND number = ? AND this_update = ?`,
			c.Number, timeArg(c.ThisUpdate), timeArg(c.NextUpdate), c.Digest, c.DER, c.Issuer, prev.Number, timeArg(prev.ThisUpdate))
	}
	if err != nil {
		return wrap("put crl "+c.Issuer, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return wrap("put crl "+c.Issuer, err)
	} else if n == 0 {
		return fmt.Errorf("sqlite: put crl %s: %w: the stored list is no longer number %d of %s", c.Issuer, store.ErrConflict, prev.Number, prev.ThisUpdate.UTC().Format(time.RFC3339Nano))
	}
	return nil
}
