package enroll

import (
	"context"
	"crypto/x509"
	"fmt"

	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// Standing refuses an agent certificate whose instance may no longer act:
// unknown to this authority, its node deleted, its instance superseded, or
// a lock on its node, instance, token or key. The agent's own RPCs and its
// stream call it, at the start and, for the stream, again and again, so a
// change made through any replica ends the stream. Errors are *Refusal
// for a refusal.
func (s *Service) Standing(ctx context.Context, leaf *x509.Certificate) error {
	if leaf == nil {
		return refuse(KindUnauthenticated, "no valid agent certificate")
	}
	serial := serialOf(leaf)
	// One read, as a renewal's first attempt makes it (on PostgreSQL one
	// round trip): the record, its instance, its node and the lock in
	// force on any of them, the instance's token or the record's key.
	rd, err := s.cfg.Store.ReadRenewal(ctx, serial, nil)
	switch {
	case err != nil:
		return err
	case !rd.CertificateFound:
		var node string
		if id, err := spiffeid.FromCertificate(leaf); err == nil {
			node = id.Name
		}
		return certificateUnknown(serial, node)
	case !rd.InstanceFound:
		return fmt.Errorf("enroll: instance %s of certificate %s: %w", rd.Certificate.InstanceID, serial, store.ErrNotFound)
	}
	if err := standingOf(rd.Certificate, rd.Instance, rd.Node, rd.NodeFound); err != nil {
		return err
	}
	if rd.Locked {
		return s.lockedOut(ctx, store.RenewalLockTargets(rd.Certificate, rd.Instance, nil), rd.Lock)
	}
	return nil
}
