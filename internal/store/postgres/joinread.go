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
		'', '', '{}'::jsonb, '', 0::bigint, NULL::bigint
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
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			bk = k
			return err
		})
	}
	if nodeID != "" {
		b.Queue(`SELECT `+nodeColumns+` FROM nodes WHERE id = $1`, nodeID).QueryRow(func(row pgx.Row) error {
			var err error
			r.Node, err = scanNode(row)
			r.NodeFound = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
	}
	if len(targets) > 0 {
		kinds, names := lockArgs(targets)
		b.Queue(findLockQuery, kinds, names).QueryRow(func(row pgx.Row) error {
			var err error
			r.Lock, err = scanLock(row)
			r.Locked = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
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
