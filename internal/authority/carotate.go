package authority

import (
	"context"
	"crypto/x509"
	"errors"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// caTick is how often the leader looks for an intermediate to prepare,
// activate or retire.
const caTick = 5 * time.Second

// MinCAIntermediateTTL is ca.intermediate_ttl's floor: short enough for
// tests to watch rotations, long enough that a step every caTick keeps up.
const MinCAIntermediateTTL = 2 * time.Minute

// caClock is the leader's job that rotates the intermediates (DESIGN.md
// "CA lifecycle"): at half the active one's life it prepares a successor,
// at two thirds it activates it, and it retires a retiring one once the
// last leaf it signed has expired — at its own not-after, since no leaf
// outlives its issuer (ca.Issuer.Issue cuts it). Each step is one
// conditional write, so a step another replica took first conflicts and
// is skipped.
func (s *Server) caClock(ctx context.Context) error {
	t := time.NewTicker(caTick)
	defer t.Stop()
	for {
		if err := s.caStep(ctx); err != nil && ctx.Err() == nil && !s.outage.fail(err) {
			s.log.Error("CA rotation step failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.caPoke:
		}
	}
}

func (s *Server) caIntermediateTTL() time.Duration {
	if s.cfg.CAIntermediateTTL > 0 {
		return s.cfg.CAIntermediateTTL
	}
	return ca.IntermediateTTL
}

// caStep takes every rotation step that has come due by the store clock.
func (s *Server) caStep(ctx context.Context) error {
	now, err := s.store.Now(ctx)
	if err != nil {
		return err
	}
	return s.caStepAt(ctx, now)
}

// caStepAt takes every rotation step due at now.
func (s *Server) caStepAt(ctx context.Context, now time.Time) error {
	rows, err := s.store.ListCACerts(ctx)
	if err != nil {
		return err
	}
	active, prepared := map[string]*x509.Certificate{}, map[string]store.CACert{}
	for _, r := range rows {
		switch r.State {
		case store.CAActive:
			c, err := x509.ParseCertificate(r.CertDER)
			if err != nil {
				return err
			}
			active[r.Role] = c
		case store.CAPrepared:
			prepared[r.Role] = r
		case store.CARetiring:
			if !now.Before(r.NotAfter) {
				s.caChange(ctx, "ca.retire", r.Role, r.Serial, "the last leaf it signed has expired",
					s.store.RetireCACert(ctx, r.Role, r.Serial))
			}
		}
	}
	if s.rootSteps(ctx, rows) {
		return nil // the steps a root rotation needed came first; the rest at the next tick
	}
	rs := s.ca.Roots()
	for _, role := range caRoles {
		a := active[string(role)]
		if a == nil {
			continue
		}
		// Its life runs from its issuance (NotBefore is backdated for
		// clock skew). One made to live longer than ca.intermediate_ttl
		// (muster init's year, or a setting since lowered) is rotated on
		// the setting's schedule.
		issued := a.NotBefore.Add(ca.Backdate)
		life := min(a.NotAfter.Sub(issued), s.caIntermediateTTL())
		p, hasPrepared := prepared[string(role)]
		switch {
		case hasPrepared && !now.Before(issued.Add(life*2/3)):
			s.caChange(ctx, "ca.activate", string(role), p.Serial, "two thirds of the active intermediate's life have passed",
				s.store.ActivateCACert(ctx, string(role), p.Serial))
		case !hasPrepared && !now.Before(issued.Add(life/2)):
			if rs.SigningKey == nil {
				s.warnNoRootKey(role, a)
				continue
			}
			row, err := s.inter.prepareUnder(ctx, role, rs.Signing, rs.SigningKey, s.caIntermediateTTL())
			s.caChange(ctx, "ca.prepare", string(role), row.Serial, "half of the active intermediate's life has passed", err)
		}
	}
	return nil
}

// warnNoRootKey logs, once per role for the life of this process, that a
// successor is due and cannot be prepared: the active intermediate runs to
// its expiry, after which its role issues nothing.
func (s *Server) warnNoRootKey(role ca.Role, active *x509.Certificate) {
	if _, warned := s.caNoRootKey.LoadOrStore(role, true); warned {
		return
	}
	s.log.Warn("a CA intermediate is due a successor but the root key is absent, so none is prepared; put the root key back in the data directory and restart the leader (`muster ca rotate --root-key` is not built yet); see docs/ca-lifecycle.md",
		"role", role, "serial", active.SerialNumber.Text(16), "expires", active.NotAfter.UTC())
}

// caChange logs and audits a rotation step; a conflict means another
// replica took it first, and is neither.
func (s *Server) caChange(ctx context.Context, action, role, serial, why string, err error) {
	switch {
	case errors.Is(err, store.ErrConflict):
		return
	case s.outage.fail(err):
		return // logged once for the whole outage; the step is taken again at the next tick
	case err != nil:
		s.log.Error("CA rotation step failed", "action", action, "role", role, "err", err)
		_ = s.recordAudit(ctx, audit.Event{Actor: "authority", Action: action, Target: role, Result: audit.ResultError, Reason: err.Error()})
		return
	}
	s.log.Info("CA intermediate rotated a step", "action", action, "role", role, "serial", serial, "reason", why)
	_ = s.recordAudit(ctx, audit.Event{Actor: "authority", Action: action, Target: role + "/" + serial, Result: audit.ResultOK, Reason: why})
}

// pokeCAClock asks the leader's CA clock, if it runs on this replica, to
// take its steps now rather than at the next tick (a root rotation phase
// changed). It never blocks; on another replica the next tick does it.
func (s *Server) pokeCAClock() {
	select {
	case s.caPoke <- struct{}{}:
	default:
	}
}
