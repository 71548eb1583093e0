package sqlite

import (
	"context"
	"errors"

	"github.com/muster-dev/muster/internal/store"
)

// joinTokenQuery answers with the token's row, or, when no token has the
// ID, with one decoy row of the same shape flagged 0 (a 32-byte ciphertext
// and 12-byte nonce, as the sealer writes for a join token's secret). Both
// cases then cost two index look-ups, one row and the same scan: the
// answer to a join with an unknown token ID takes as long as one with a
// known ID and a wrong secret (TestJoinTokenRefusalTiming measures it),
// so its timing does not tell whether the ID exists.
const joinTokenQuery = `SELECT 1, ` + tokenColumns + ` FROM tokens WHERE id = ?1
	UNION ALL
	SELECT 0, ?1, 'token', zeroblob(32), zeroblob(12), 1, 0, 0, '', '', '{}', '', 0, NULL, 'client'
	WHERE NOT EXISTS (SELECT 1 FROM tokens WHERE id = ?1)`

// flagged scans a leading found flag into found, then the row.
type flagged struct {
	row   scanner
	found *int64
}

func (f flagged) Scan(dst ...any) error { return f.row.Scan(append([]any{f.found}, dst...)...) }

// ReadJoin reads the token (or the decoy), the node and the lock one after
// another on the read pool: in process, a read costs no round trip, so
// the three queries a join made before cost what they cost then.
func (s *SQLite) ReadJoin(ctx context.Context, tokenID, nodeID string, targets []store.LockTarget) (store.JoinRead, error) {
	var r store.JoinRead
	if tokenID != "" {
		var found int64
		t, err := scanToken(flagged{s.r.QueryRowContext(ctx, joinTokenQuery, tokenID), &found})
		if err != nil {
			return store.JoinRead{}, wrap("read join: token "+tokenID, err)
		}
		if found != 0 {
			ts := []store.Token{t}
			if err := withBoundKeypairs(ctx, s.r, ts); err != nil {
				return store.JoinRead{}, wrap("read join: token "+tokenID, err)
			}
			r.Token, r.TokenFound = ts[0], true
		}
	}
	if nodeID != "" {
		n, err := s.GetNode(ctx, nodeID)
		switch {
		case err == nil:
			r.Node, r.NodeFound = n, true
		case !errors.Is(err, store.ErrNotFound):
			return store.JoinRead{}, err
		}
	}
	if len(targets) > 0 {
		l, err := s.FindAnyLock(ctx, targets)
		switch {
		case err == nil:
			r.Lock, r.Locked = l, true
		case !errors.Is(err, store.ErrNotFound):
			return store.JoinRead{}, err
		}
	}
	return r, nil
}

// ReadRenewal reads the record, the instance, the node and the lock one
// after another on the read pool, as the renewal did before.
func (s *SQLite) ReadRenewal(ctx context.Context, serial string, keys []string) (store.RenewalRead, error) {
	var r store.RenewalRead
	found := func(err error) (bool, error) {
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	}
	var err error
	r.Certificate, err = s.GetCertificate(ctx, serial)
	if r.CertificateFound, err = found(err); err != nil || !r.CertificateFound {
		return store.RenewalRead{}, err
	}
	r.Instance, err = s.GetInstance(ctx, r.Certificate.InstanceID)
	if r.InstanceFound, err = found(err); err != nil {
		return store.RenewalRead{}, err
	}
	r.Node, err = s.GetNode(ctx, r.Certificate.NodeID)
	if r.NodeFound, err = found(err); err != nil {
		return store.RenewalRead{}, err
	}
	r.Lock, err = s.FindAnyLock(ctx, store.RenewalLockTargets(r.Certificate, r.Instance, keys))
	if r.Locked, err = found(err); err != nil {
		return store.RenewalRead{}, err
	}
	return r, nil
}
