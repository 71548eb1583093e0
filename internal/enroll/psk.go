package enroll

import (
	"context"
	"errors"
	"fmt"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// Results of a PSK validation, for PSKObserver.
const (
	PSKResultActive  = "active"
	PSKResultGrace   = "grace"
	PSKResultInvalid = "invalid"
)

// Reasons of PSK bootstrap refusals. DESIGN.md: PERMISSION_DENIED with a
// message that says which check failed.
const (
	ReasonPSKMissing  = "bootstrap PSK is missing"
	ReasonPSKMismatch = "bootstrap PSK does not match"
	reasonNoDiscovery = "referral tickets need a discovery service, which this authority is not configured with"
	reasonNodeTaken   = "node ID already exists; an operator must delete the node before it can join again"
)

// BootstrapWithPSK admits an agent with the authority's bootstrap PSK. The
// CSR is required and its common name is the node ID. The checks run in
// this order: fields well-formed (INVALID_ARGUMENT); the source's rate
// limit; the PSK matches the active or an unexpired grace PSK (compared
// in constant time against each); the node ID is free, unless the request
// repeats a join of the same PSK, node and key within the retry window,
// which gets the certificate already issued; no lock on the node. A
// refused attempt writes nothing but its audit record, which names the
// PSK by ID, never by value.
//
// Referral tickets need a discovery service, which is not built yet: a
// request carrying one is refused.
func (s *Service) BootstrapWithPSK(ctx context.Context, r Request, pskText, referralTicket string, csrData []byte) (*Issued, error) {
	ev := audit.Event{Actor: "anonymous", Action: "agent.join", Source: r.Source, CorrelationID: r.CorrelationID}
	iss, err := s.bootstrapPSK(ctx, r, pskText, referralTicket, csrData, &ev)
	return s.finish(ctx, ev, iss, err)
}

func (s *Service) bootstrapPSK(ctx context.Context, r Request, pskText, referralTicket string, csrData []byte, ev *audit.Event) (*Issued, error) {
	// 1. Fields well-formed.
	var given psk.PSK
	if pskText != "" {
		var err error
		if given, err = psk.Parse(pskText); err != nil {
			return nil, refuse(KindInvalid, "bootstrap_psk: "+err.Error())
		}
	}
	if referralTicket != "" {
		return nil, refuse(KindInvalid, reasonNoDiscovery)
	}
	if len(csrData) == 0 {
		return nil, refuse(KindInvalid, "csr is required: its common name is the node ID")
	}
	csr, err := ca.ParseCSR(csrData)
	if err != nil {
		return nil, refuse(KindInvalid, "csr: "+err.Error())
	}
	nodeID := csr.Subject.CommonName
	if err := spiffeid.ValidNodeID(nodeID); err != nil {
		return nil, refuse(KindInvalid, "csr common name (the node ID): "+err.Error())
	}
	ev.Target = nodeID
	kid, err := keyID(csr.PublicKey)
	if err != nil {
		return nil, err
	}
	// 2. The source's rate limit.
	if s.cfg.Limiter != nil && !s.cfg.Limiter.Allow(r.Source) {
		return nil, refuse(KindRateLimited, "too many requests from this source")
	}
	// 3. The PSK matches.
	if pskText == "" {
		s.observePSK(PSKResultInvalid)
		return nil, refuse(KindPermissionDenied, ReasonPSKMissing)
	}
	matched, err := s.matchPSK(ctx, given)
	if err != nil {
		return nil, err
	}
	if matched.ID == "" {
		s.observePSK(PSKResultInvalid)
		return nil, refuse(KindPermissionDenied, ReasonPSKMismatch)
	}
	s.observePSK(matched.Status)
	ev.Actor = "psk:" + matched.ID
	proof := fmt.Sprintf("psk %s (%s)", matched.ID, matched.Status)

	// 4. Node ID free, or a retry of the join that took it.
	now := s.cfg.Now()
	node, err := s.cfg.Store.GetNode(ctx, nodeID)
	nodeExists := err == nil
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if nodeExists {
		if node.TokenID == matched.ID {
			if iss, err := s.retryJoin(ctx, node, matched.ID, kid, now); iss != nil || err != nil {
				return iss, err
			}
		}
		return nil, refuse(KindAlreadyExists, reasonNodeTaken).with("%s", proof)
	}
	// 5. No lock on the node or the key to certify.
	if l, err := s.lockOn(ctx, [2]string{store.LockNode, nodeID}, keyLock(kid)); err != nil {
		return nil, err
	} else if l != nil {
		return nil, refuse(KindPermissionDenied, ReasonLocked).with("%s, lock %s on %s %s", proof, l.ID, l.Kind, l.Target)
	}

	return s.admit(ctx, admission{nodeID: nodeID, credential: matched.ID, proof: proof, method: store.JoinMethodPSK,
		pub: csr.PublicKey, keyID: kid, now: now}, ev)
}

// matchPSK returns the stored PSK, active or in an unexpired grace, that
// equals given, or a zero PSK. Every candidate is compared, in constant
// time, so the time taken does not say which one matched. A grace PSK
// whose grace has ended by the store clock never matches, and is revoked
// on the way (DESIGN.md: expired grace PSKs are revoked lazily on
// validation).
func (s *Service) matchPSK(ctx context.Context, given psk.PSK) (store.PSK, error) {
	if s.cfg.PSKSealer == nil {
		return store.PSK{}, errors.New("enroll: no PSK sealer configured")
	}
	now, err := s.cfg.Store.Now(ctx)
	if err != nil {
		return store.PSK{}, err
	}
	ps, err := s.cfg.Store.ListPSKs(ctx)
	if err != nil {
		return store.PSK{}, err
	}
	var matched store.PSK
	expired := false
	for _, p := range ps {
		switch {
		case p.Status == store.PSKActive:
		case p.Status == store.PSKGrace && now.Before(p.GraceExpiresAt):
		case p.Status == store.PSKGrace:
			expired = true
			continue
		default:
			continue
		}
		b, err := s.cfg.PSKSealer.Open(p.Ciphertext, p.Nonce, []byte(p.ID))
		if err != nil {
			return store.PSK{}, fmt.Errorf("enroll: psk %s: %w", p.ID, err)
		}
		stored, err := psk.FromBytes(b)
		if err != nil {
			return store.PSK{}, fmt.Errorf("enroll: psk %s: %w", p.ID, err)
		}
		if stored.Equal(given) && matched.ID == "" {
			matched = p
		}
	}
	if expired && s.cfg.ExpireGracePSKs != nil {
		s.cfg.ExpireGracePSKs(ctx)
	}
	return matched, nil
}

func (s *Service) observePSK(result string) {
	if s.cfg.PSKObserver != nil {
		s.cfg.PSKObserver(result)
	}
}
