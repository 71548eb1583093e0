package enroll

import (
	"context"
	"crypto/hmac"
	"crypto/x509"
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/time/rate"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// Renew certifies a new key for the instance that holds leaf, the agent
// certificate the caller presented over mTLS (already verified to chain to
// the agent intermediate). It applies the generation rule: presenting
// generation g when g+1 exists is a retry if the CSR carries the key
// certified for g+1, and a copy otherwise, which locks the instance.
func (s *Service) Renew(ctx context.Context, r Request, leaf *x509.Certificate, csrData []byte) (*Issued, error) {
	ev := audit.Event{Actor: "anonymous", Action: "agent.renew", Source: r.Source, CorrelationID: r.CorrelationID}
	if id, err := spiffeid.FromCertificate(leaf); err == nil {
		ev.Actor, ev.Target = id.String(), id.Name
	}
	iss, err := s.renew(ctx, leaf, csrData, nil, &ev, nil)
	return s.finish(ctx, ev, iss, err)
}

// renew certifies csrData for leaf's instance; claims (a bound key's
// rotation on a refresh) are won in the renewal's write or fail it. From
// a bound-keypair refresh, h is what the join read of leaf's record and
// instance, whose locks it checked together with its own: the first
// attempt starts from it rather than reading and checking again.
func (s *Service) renew(ctx context.Context, leaf *x509.Certificate, csrData []byte, claims []store.Claim, ev *audit.Event, h *held) (*Issued, error) {
	if leaf == nil {
		return nil, refuse(KindUnauthenticated, "no valid agent certificate")
	}
	csr, err := ca.ParseCSR(csrData)
	if err != nil {
		return nil, refuse(KindInvalid, "csr: "+err.Error())
	}
	kid, err := keyID(csr.PublicKey)
	if err != nil {
		return nil, err
	}
	serial := serialOf(leaf)
	var (
		rec store.Certificate
		// read is what the first attempt of a plain renewal read at once:
		// the record, the instance, the node and the locks of standing.
		read *store.RenewalRead
	)
	if h != nil {
		rec = h.rec
	} else {
		rd, err := s.cfg.Store.ReadRenewal(ctx, serial, []string{keyLock(kid).Target})
		switch {
		case err != nil:
			return nil, err
		case !rd.CertificateFound:
			return nil, certificateUnknown(serial, ev.Target)
		}
		rec, read = rd.Certificate, &rd
	}
	if rec.NodeID != ev.Target {
		return nil, refuse(KindPermissionDenied, ReasonCertificateUnknown).with("serial %s was issued to %s", serial, rec.NodeID)
	}

	counted := false
	for attempt := 0; ; attempt++ {
		var inst store.Instance
		if attempt == 0 && h != nil {
			inst = h.inst
			if err := standingOf(rec, inst, h.node, h.nodeFound); err != nil {
				return nil, err
			}
		} else if attempt == 0 && read != nil {
			if !read.InstanceFound {
				return nil, fmt.Errorf("enroll: instance %s: %w", rec.InstanceID, store.ErrNotFound)
			}
			inst = read.Instance
			if err := standingOf(rec, inst, read.Node, read.NodeFound); err != nil {
				return nil, err
			}
			if read.Locked {
				return nil, s.lockedOut(ctx, store.RenewalLockTargets(rec, inst, []string{keyLock(kid).Target}), read.Lock)
			}
		} else {
			if inst, err = s.cfg.Store.GetInstance(ctx, rec.InstanceID); err != nil {
				return nil, err
			}
			if err := s.standing(ctx, rec, inst, kid); err != nil {
				return nil, err
			}
		}
		if h == nil && inst.JoinMethod == store.JoinMethodBoundKeypair {
			// Not even a retry's answer: the challenge is the only way.
			return nil, refuse(KindFailedPrecondition, ReasonChallengeRequired).with("instance %s of token %s", inst.ID, inst.TokenID)
		}
		switch g := rec.Generation; {
		case inst.Generation == g+1 && hmac.Equal(inst.LastPublicKey, kid):
			ev.Reason = "retry answered with generation " + strconv.FormatInt(inst.Generation, 10) + ", serial " + inst.LastSerial
			return s.issuedFrom(rec.NodeID, inst, true)
		case inst.Generation != g:
			return nil, s.copyDetected(ctx, rec, inst)
		}
		// Counted once per request, however many attempts its write
		// takes, and only once a certificate is to be signed: a retry's
		// answer and a refusal cost no signature.
		if !counted {
			counted = true
			if err := s.allowRenewal(inst); err != nil {
				return nil, err
			}
		}
		now := s.cfg.Now()
		serverAuth := servesTLS(leaf)
		if h != nil {
			serverAuth = h.serverAuth
		}
		next, chain, err := s.issue(rec.NodeID, inst.JoinMethod, csr.PublicKey, now, serverAuth)
		if err != nil {
			return nil, err
		}
		cert := store.Certificate{
			Serial: next.SerialNumber.Text(16), NodeID: rec.NodeID, InstanceID: inst.ID, Generation: rec.Generation + 1,
			JoinMethod: inst.JoinMethod, TokenID: inst.TokenID, PublicKey: kid,
			NotBefore: next.NotBefore, NotAfter: next.NotAfter, IssuedAt: now,
		}
		ev.Result = audit.ResultOK
		// Concatenated, not formatted: every renewal builds this reason.
		ev.Reason = "instance " + inst.ID + ", generation " + strconv.FormatInt(rec.Generation+1, 10) + ", serial " + cert.Serial
		if h != nil {
			ev.Reason += h.note
		}
		build, err := s.cfg.Audit.Builder(*ev)
		if err != nil {
			return nil, err
		}
		// The write is refused by a lock created on what was checked
		// since it was read.
		targets := store.RenewalLockTargets(rec, inst, []string{keyLock(kid).Target})
		if h != nil {
			targets = append(targets, store.Named(h.targets)...)
		}
		updated, err := s.cfg.Store.CommitRenewal(ctx, store.Renewal{InstanceID: inst.ID, FromGeneration: rec.Generation,
			Certificate: cert, ChainPEM: chain, Claims: claims, LockTargets: targets, Audit: build.Build})
		if errors.Is(err, store.ErrNotFound) && len(claims) > 0 {
			// A refresh's token was deleted between the challenge and the
			// write: deleting the token ends refreshes.
			var flags string
			if h != nil {
				flags = h.flags
			}
			return nil, refuse(KindNotFound, ReasonUnknownBoundToken).with("%s: the token was deleted during the exchange; %s", ev.Reason, deletedTokenWayOut(inst.TokenID, inst.NodeID, flags, h != nil))
		}
		if errors.Is(err, store.ErrKeyBindingChanged) {
			// Another join rotated or bound the key between the challenge
			// and the write: this answer proved the old one.
			return nil, refuse(KindUnauthenticated, ReasonChallengeFailed).with("%s: the bound key changed during the exchange", ev.Reason)
		}
		if errors.Is(err, store.ErrConflict) && attempt == 0 {
			// Another request advanced or ended the instance between the
			// read and the write: judge this one again against what it
			// did.
			continue
		} else if err != nil {
			return nil, err
		}
		s.cfg.Audit.Appended(build)
		iss := &Issued{NodeID: rec.NodeID, ChainPEM: chain, CAPEM: s.rootsPEM(), InstanceID: inst.ID,
			Generation: updated.Generation, NotAfter: next.NotAfter, audited: true}
		// Read during this request, before its write: a signer step
		// committed before the request began is in it.
		switch {
		case read != nil:
			iss.SignerSet, iss.SignerSetRead = read.SignerSet, true
		case h != nil:
			iss.SignerSet, iss.SignerSetRead = h.signerSet, true
		}
		return iss, nil
	}
}

// ReasonRenewalsTooOften is the refusal of a renewal past its instance's
// allowance, limits.renewals_per_lifetime renewals in each certificate
// lifetime: many times what renewing at half-life needs, so an agent
// refused it renews far more often than its lifetime justifies (a
// script, or a stolen certificate renewing without pause).
const ReasonRenewalsTooOften = "renewed too often for the certificate's lifetime (limits.renewals_per_lifetime): an agent renews by itself at half of it, so wait for that renewal; or raise limits.renewals_per_lifetime on the authority"

// allowRenewal takes one renewal from inst's allowance:
// RenewalsPerLifetime at once, refilled at RenewalsPerLifetime in each
// lifetime of the certificates inst is given. Counted per instance, so a
// re-join (a new instance) starts afresh and a copy shares its
// original's allowance; in the memory of this replica, so each replica
// allows as much.
func (s *Service) allowRenewal(inst store.Instance) error {
	n := s.cfg.RenewalsPerLifetime
	ttl := s.certTTL(inst.JoinMethod)
	if s.cfg.Renewals == nil || n <= 0 || ttl <= 0 {
		return nil
	}
	if s.cfg.Renewals.AllowRate(inst.ID, rate.Limit(float64(n)/ttl.Seconds()), n) {
		return nil
	}
	return refuse(KindRateLimited, ReasonRenewalsTooOften).with("instance %s of node %s: more than %d renewals in a certificate lifetime of %s", inst.ID, inst.NodeID, n, ttl)
}

// standing refuses an instance that may not renew: its node deleted, the
// instance superseded, or a lock on node, instance, token, the key it holds
// or the key it asks to have certified. It is the only lock check of a
// renewal (authorization leaves the node's to it), one query for them all.
func (s *Service) standing(ctx context.Context, rec store.Certificate, inst store.Instance, kid []byte) error {
	if err := s.nodeStanding(ctx, rec, inst); err != nil {
		return err
	}
	// The targets of ReadRenewal, which the first attempt read with them:
	// node, instance, token, the key held and the key asked for.
	targets := store.RenewalLockTargets(rec, inst, []string{keyLock(kid).Target})
	l, err := s.lockOn(ctx, targets...)
	if err != nil {
		return err
	}
	if l != nil {
		return s.lockedOut(ctx, targets, *l)
	}
	return nil
}

// lockedOut is a renewal's refusal for a lock in force, l on one of
// targets.
func (s *Service) lockedOut(ctx context.Context, targets []store.LockTarget, l store.Lock) error {
	return s.lockedOn(ctx, targets, l, "lock %s on %s %s", l.ID, l.Kind, l.Target)
}

// nodeStanding refuses an instance whose node was deleted or that was
// superseded: standing without the locks.
func (s *Service) nodeStanding(ctx context.Context, rec store.Certificate, inst store.Instance) error {
	node, err := s.cfg.Store.GetNode(ctx, rec.NodeID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return standingOf(rec, inst, node, err == nil)
}

// standingOf is nodeStanding on a node already read (found false: no node
// holds the ID).
func standingOf(rec store.Certificate, inst store.Instance, node store.Node, found bool) error {
	switch {
	case inst.State == store.InstanceDeleted, !found:
		return refuse(KindPermissionDenied, ReasonDeleted).with("instance %s: the node was deleted; %s", inst.ID, standingWayOut(rec, inst, ReasonDeleted))
	case inst.State == store.InstanceSuperseded || node.InstanceID != inst.ID:
		return refuse(KindPermissionDenied, ReasonSuperseded).with("instance %s superseded by %s (muster agents show %s lists them); %s", inst.ID, node.InstanceID, rec.NodeID, standingWayOut(rec, inst, ReasonSuperseded))
	}
	return nil
}

// standingWayOut is the way out of a standing refusal for reason, for the
// operator reading the record: a bound-keypair node comes back by its
// agent's refresh with the bound key (a recovery), any other by a join
// with a token bound to the node. Made only on a refusal: standingOf runs
// on every renewal and stream standing check.
func standingWayOut(rec store.Certificate, inst store.Instance, reason string) string {
	switch {
	case inst.JoinMethod != store.JoinMethodBoundKeypair:
		return fmt.Sprintf("if the machine should be node %s, muster token create --node %s, then muster agent join --force on it with that joining URI", rec.NodeID, rec.NodeID)
	case reason == ReasonDeleted:
		return fmt.Sprintf("a bound-keypair agent comes back by its refresh, a recovery with its bound key, while token %s exists: muster token delete %s ends it", inst.TokenID, inst.TokenID)
	default:
		return fmt.Sprintf("a later recovery through token %s replaced it, so a machine presenting it is behind (a copy of the bound key, or a directory restored from an older backup): its refresh with the bound key says which", inst.TokenID)
	}
}

// copyDetected locks the instance: two holders of one identity have
// diverged, and the authority cannot tell which is genuine.
func (s *Service) copyDetected(ctx context.Context, rec store.Certificate, inst store.Instance) error {
	reason := fmt.Sprintf("copy_detected: generation %d presented (serial %s) after generation %d was issued", rec.Generation, rec.Serial, inst.Generation)
	l := store.Lock{ID: newLockID(), Kind: store.LockInstance, Target: inst.ID, Reason: reason,
		CreatedBy: "authority", CreatedAt: s.cfg.Now()}
	// The lock goes in with its record, or neither does.
	link, err := s.cfg.Audit.Builder(audit.Event{Actor: "authority", Action: "lock.create", Target: "instance " + inst.ID,
		Result: audit.ResultOK, Reason: reason})
	if err != nil {
		return err
	}
	if err := s.cfg.Store.InsertLock(ctx, l, link.Build); err != nil {
		return err
	}
	s.cfg.Audit.Appended(link)
	rejoin := fmt.Sprintf("muster token create --node %s, then muster agent join --force on it with that joining URI", inst.NodeID)
	if inst.JoinMethod == store.JoinMethodBoundKeypair {
		rejoin = "its agent recovers with its bound key once its certificate has expired"
	}
	return refuse(KindPermissionDenied, ReasonCopyDetected).with("instance %s locked by %s: two holders of this identity (a copied data directory, or one restored from an older backup); find the copy and stop it; the machine to keep comes back in a new instance (%s); muster lock delete %s then removes the lock, which holds the old instance only",
		inst.ID, l.ID, rejoin, l.ID)
}
