package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// revokedQuery drives every branch from a small set (the locks in force,
// the recently deleted instances) into the record of issuance by an index:
// certificates by node, instance and public key, operators by name. A
// public-key lock's target is hex; one that is not (no lock the API takes)
// matches nothing rather than failing the query.
const revokedQuery = `WITH l AS (SELECT kind, target, created_at FROM locks
		WHERE kind IN ('node', 'instance', 'public_key', 'admin') AND ` + unexpired + `)
	SELECT c.serial, c.not_before, c.not_after, false, l.kind, l.created_at
		FROM l JOIN certificates c ON c.node_id = l.target
		WHERE l.kind = 'node' AND c.not_after > ` + nowMicros + `
	UNION ALL
	SELECT c.serial, c.not_before, c.not_after, false, l.kind, l.created_at
		FROM l JOIN certificates c ON c.instance_id = l.target
		WHERE l.kind = 'instance' AND c.not_after > ` + nowMicros + `
	UNION ALL
	SELECT c.serial, c.not_before, c.not_after, false, l.kind, l.created_at
		FROM l JOIN certificates c ON c.public_key =
			CASE WHEN l.target ~ '^([0-9a-f][0-9a-f])+$' THEN decode(l.target, 'hex') END
		WHERE l.kind = 'public_key' AND c.not_after > ` + nowMicros + `
	UNION ALL
	SELECT o.serial, o.not_before, o.not_after, true, l.kind, l.created_at
		FROM l JOIN operators o ON o.name = l.target
		WHERE l.kind = 'admin' AND o.not_after > ` + nowMicros + `
	UNION ALL
	SELECT c.serial, c.not_before, c.not_after, false, 'deleted', NULL
		FROM instances i JOIN certificates c ON c.instance_id = i.id
		WHERE i.state = 'deleted' AND i.last_issued_at > $1 AND c.not_after > ` + nowMicros

// ListRevokedCertificates returns the unexpired certificates of locked
// nodes, instances, public keys and operators and of deleted nodes, in one
// query (see store.CRLStore).
func (s *Store) ListRevokedCertificates(ctx context.Context, issuedAfter time.Time) ([]store.RevokedCertificate, error) {
	rows, err := s.pool.Query(ctx, revokedQuery, issuedAfter.UnixMicro())
	if err != nil {
		return nil, wrap("list revoked certificates", err)
	}
	defer rows.Close()
	var out []store.RevokedCertificate
	for rows.Next() {
		var (
			c                          store.RevokedCertificate
			notBefore, notAfter, since *int64
		)
		if err := rows.Scan(&c.Serial, &notBefore, &notAfter, &c.Operator, &c.Reason, &since); err != nil {
			return nil, wrap("list revoked certificates", err)
		}
		c.NotBefore, c.NotAfter, c.Since = timeCol(notBefore), timeCol(notAfter), timeCol(since)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list revoked certificates", err)
	}
	return out, nil
}

// GetCRL returns the stored list of issuer; ErrNotFound.
func (s *Store) GetCRL(ctx context.Context, issuer string) (store.CRL, error) {
	c := store.CRL{Issuer: issuer}
	var thisUpdate, nextUpdate *int64
	err := s.pool.QueryRow(ctx, `SELECT number, this_update, next_update, digest, der FROM crls WHERE issuer = $1`, issuer).
		Scan(&c.Number, &thisUpdate, &nextUpdate, &c.Digest, &c.DER)
	if err != nil {
		return store.CRL{}, wrap("get crl "+issuer, err)
	}
	c.ThisUpdate, c.NextUpdate = timeCol(thisUpdate), timeCol(nextUpdate)
	return c, nil
}

// PutCRL stores c if the stored list of its issuer is prev, its number
// and this update (number 0: none); ErrConflict otherwise. One statement:
// the insert or the update conditional on the list read, so of replicas
// racing after one list exactly one wins.
func (s *Store) PutCRL(ctx context.Context, c store.CRL, prev store.CRL) error {
	if c.Number <= prev.Number {
		return fmt.Errorf("postgres: put crl %s: %w: number %d does not follow %d", c.Issuer, store.ErrConflict, c.Number, prev.Number)
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	if prev.Number == 0 {
		tag, err = s.pool.Exec(ctx, `INSERT INTO crls (issuer, number, this_update, next_update, digest, der)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (issuer) DO NOTHING`,
			c.Issuer, c.Number, timeArg(c.ThisUpdate), timeArg(c.NextUpdate), c.Digest, c.DER)
	} else {
		tag, err = s.pool.Exec(ctx, `UPDATE crls SET number = $1, this_update = $2, next_update = $3, digest = $4, der = $5
			WHERE issuer = $6 AND number = $7 AND this_update = $8`,
			c.Number, timeArg(c.ThisUpdate), timeArg(c.NextUpdate), c.Digest, c.DER, c.Issuer, prev.Number, timeArg(prev.ThisUpdate))
	}
	if err != nil {
		return wrap("put crl "+c.Issuer, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: put crl %s: %w: the stored list is no longer number %d of %s", c.Issuer, store.ErrConflict, prev.Number, prev.ThisUpdate.UTC().Format(time.RFC3339Nano))
	}
	return nil
}
