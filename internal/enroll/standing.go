package enroll

import (
	"context"
	"crypto/x509"
	"errors"

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
	rec, err := s.cfg.Store.GetCertificate(ctx, serial)
	if errors.Is(err, store.ErrNotFound) {
		return refuse(KindPermissionDenied, "certificate unknown to this authority").with("serial %s", serial)
	} else if err != nil {
		return err
	}
	inst, err := s.cfg.Store.GetInstance(ctx, rec.InstanceID)
	if err != nil {
		return err
	}
	return s.standing(ctx, rec, inst, rec.PublicKey)
}
