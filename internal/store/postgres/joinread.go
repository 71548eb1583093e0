package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// joinTokenQuery answers with the token's row, or, when no token has the
// ID, with one decoy row of the same shape flagged false (as the SQLite
// store does): an unknown ID costs the same look-ups and row as a known
// one, so a join's refusal time does not tell whether the ID exists.
const joinTokenQuery = `SELECT true, ` + tokenColumns + ` FROM tokens WHERE id = $1::text
	UNION ALL
	SELECT false, $1::text, 'token', decode(repeat('00', 32), 'hex'), decode(repeat('00', 12), 'hex'), 1, 0, 0::bigint,
		'', '', '{}'::jsonb, '', 0::bigint, NULL::bigint, 'client'
	WHERE NOT EXISTS (SELECT 1 FROM tokens WHERE id = $1::text)`

// flagged scans a leading found flag into found, then the row.
type flagged struct {
	row   pgx.Row
	found *bool
}

func (f flagged) Scan(dst ...any) error { return f.row.Scan(append([]any{f.found}, dst...)...) }

// ReadJoin sends the token's row (or the decoy), its bound-keypair row,
// the node's row and the lock query as one batch: one round trip, however
// many of the four a join needs.
func (s *Store) ReadJoin(ctx context.Context, tokenID, nodeID string, targets []store.LockTarget) (store.JoinRead, error) {
	var (
		r  store.JoinRead
		bk *store.BoundKeypair
		b  pgx.Batch
	)
	if tokenID != "" {
		b.Queue(joinTokenQuery, tokenID).QueryRow(func(row pgx.Row) error {
			var err error
			r.Token, err = scanToken(flagged{row, &r.TokenFound})
			return err
		})
		// The bound-keypair row is asked for whatever the token's method:
		// the answer comes in the same round trip, and the probe costs an
		// unknown ID what it costs a known one.
		b.Queue(`SELECT `+boundKeypairColumns+` FROM bound_keypairs WHERE token_id = $1`, tokenID).QueryRow(func(row pgx.Row) error {
			_, k, err := scanBoundKeypair(row)
			bk = k
			return noRows(err)
		})
	}
	if nodeID != "" {
		b.Queue(`SELECT `+nodeColumns+` FROM nodes WHERE id = $1`, nodeID).QueryRow(func(row pgx.Row) error {
			var err error
			r.Node, err = scanNode(row)
			r.NodeFound = err == nil
			return noRows(err)
		})
	}
	if len(targets) > 0 {
		kinds, names := lockArgs(targets)
		b.Queue(findLockQuery, kinds, names).QueryRow(func(row pgx.Row) error {
			var err error
			r.Lock, err = scanLock(row)
			r.Locked = err == nil
			return noRows(err)
		})
	}
	if b.Len() == 0 {
		return r, nil
	}
	if err := s.pool.SendBatch(ctx, &b).Close(); err != nil {
		return store.JoinRead{}, wrap("read join", err)
	}
	switch {
	case !r.TokenFound:
		r.Token = store.Token{}
	case r.Token.JoinMethod == store.JoinMethodBoundKeypair:
		r.Token.BoundKeypair = bk
	}
	return r, nil
}

// ReadRenewal sends the record, its instance, its node, the lock query
// and the verifier set's ID as one batch: one round trip. The lock query finds its targets from the
// record and the instance itself, in store.RenewalLockTargets' order.
func (s *Store) ReadRenewal(ctx context.Context, serial string, keys []string) (store.RenewalRead, error) {
	var (
		r store.RenewalRead
		b pgx.Batch
	)
	b.Queue(`SELECT `+certificateColumns+` FROM certificates WHERE serial = $1`, serial).QueryRow(func(row pgx.Row) error {
		var err error
		r.Certificate, err = scanCertificate(row)
		r.CertificateFound = err == nil
		return noRows(err)
	})
	b.Queue(`SELECT `+instanceColumns+` FROM instances
		WHERE id = (SELECT instance_id FROM certificates WHERE serial = $1)`, serial).QueryRow(func(row pgx.Row) error {
		var err error
		r.Instance, err = scanInstance(row)
		r.InstanceFound = err == nil
		return noRows(err)
	})
	b.Queue(`SELECT `+nodeColumns+` FROM nodes
		WHERE id = (SELECT node_id FROM certificates WHERE serial = $1)`, serial).QueryRow(func(row pgx.Row) error {
		var err error
		r.Node, err = scanNode(row)
		r.NodeFound = err == nil
		return noRows(err)
	})
	kinds := []string{store.LockNode, store.LockInstance, store.LockToken, store.LockPublicKey}
	for range keys {
		kinds = append(kinds, store.LockPublicKey)
	}
	b.Queue(`WITH wanted AS (
			SELECT want_kind, want_target, pos
			FROM certificates c LEFT JOIN instances i ON i.id = c.instance_id,
				unnest($2::text[], ARRAY[c.node_id, i.id, i.token_id, encode(c.public_key, 'hex')] || $3::text[])
					WITH ORDINALITY AS w (want_kind, want_target, pos)
			WHERE c.serial = $1)
		SELECT `+lockColumns+`
		FROM wanted JOIN locks ON kind = want_kind AND target = want_target
		WHERE want_target <> '' AND `+unexpired+`
		ORDER BY pos, created_at, id LIMIT 1`, serial, kinds, keys).QueryRow(func(row pgx.Row) error {
		var err error
		r.Lock, err = scanLock(row)
		r.Locked = err == nil
		return noRows(err)
	})
	b.Queue(`SELECT version, stepped_at FROM signer_set WHERE id = 1`).QueryRow(func(row pgx.Row) error {
		return row.Scan(&r.SignerSet.Version, &r.SignerSet.SteppedAt)
	})
	if err := s.pool.SendBatch(ctx, &b).Close(); err != nil {
		return store.RenewalRead{}, wrap("read renewal", err)
	}
	if !r.CertificateFound {
		return store.RenewalRead{}, nil
	}
	return r, nil
}

// noRows is nil for pgx.ErrNoRows: an absent row is a flag of the read,
// not its failure.
func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}
