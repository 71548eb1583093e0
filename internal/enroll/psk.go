package enroll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/referral"
	"github.com/muster-dev/muster/internal/seal"
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
	ReasonPSKMissing    = "bootstrap PSK is missing"
	ReasonPSKMismatch   = "bootstrap PSK does not match"
	ReasonTicketMissing = "referral ticket is missing: this authority admits PSK agents through its discovery service"
	ReasonTicketUsed    = "referral ticket was already used: ask the discovery service for a new one"
	// ReasonTicketKeyUnknown: discovery no longer publishes the key that
	// signed the ticket, most often one revoked seconds after it did; a
	// fresh ticket is signed by the key discovery signs with now. The
	// audit record's detail names the key.
	ReasonTicketKeyUnknown = "referral ticket is signed by a key the discovery service no longer publishes (revoked, or rotated away, since it signed): ask it for a new one"
	// ReasonTicketKeyNotFetched: the ticket's key is not among those
	// fetched from discovery seconds ago (UNAVAILABLE): retried, the
	// ticket passes once the key is fetched.
	ReasonTicketKeyNotFetched = "cannot check the referral ticket now: it is signed by a key this authority has not fetched from the discovery service yet; retry in a few seconds"
	reasonNoDiscovery         = "referral tickets need a discovery service, which this authority is not configured with"
	reasonTicketKeys          = "cannot check the referral ticket now: the discovery service's keys are unavailable"
)

// Results of a referral-ticket check, for TicketObserver.
const (
	TicketResultOK       = "ok"
	TicketResultMissing  = "missing"
	TicketResultInvalid  = "invalid"
	TicketResultExpired  = "expired"
	TicketResultReplayed = "replayed"
)

// CredentialTicketOnly is what a join admitted by a referral ticket without
// a PSK (bootstrap.psk_required false, before psk_optional_until) records
// in place of a PSK ID.
const CredentialTicketOnly = "ticket-only"

// TicketVerifier checks a referral ticket's signature and claims for a node;
// *referral.Invalid says why one is refused. Single use is the store's.
type TicketVerifier interface {
	Verify(ctx context.Context, token, nodeID string) (referral.Claims, error)
}

// BootstrapWithPSK admits an agent with the authority's bootstrap PSK and,
// when a discovery service is configured, a referral ticket. The CSR is
// required and its common name is the node ID. The checks run in this
// order: fields well-formed (INVALID_ARGUMENT); the source's rate limit;
// the referral ticket's signature and claims, when tickets are enforced;
// the PSK matches the active or an unexpired grace PSK (compared in
// constant time against each), or may be left out during the migration
// window; the node ID is free, unless the request repeats a join of the
// same credential, node and key within the retry window, which gets the
// certificate already issued; no lock on the node or key; and, at the
// write, the ticket unused (its single use is written with the join). A
// refused attempt writes nothing but its audit record, which names the PSK by ID
// and the ticket by jti, never a secret.
func (s *Service) BootstrapWithPSK(ctx context.Context, r Request, pskText, referralTicket string, csrData []byte) (*Issued, error) {
	return join(ctx, s, pskMethod{s}, r, PSKPayload{PSK: pskText, ReferralTicket: referralTicket, CSR: csrData}, nil)
}

// PSKPayload is what a PSK bootstrap presents.
type PSKPayload struct {
	PSK            string // "" during the migration window only
	ReferralTicket string // required when a discovery service is configured
	CSR            []byte // required: its common name is the node ID
}

// PSKConfig is the PSK method's configuration.
type PSKConfig struct {
	// PSKSealer opens bootstrap PSKs (purpose seal.InfoPSK); without it
	// every PSK bootstrap fails.
	PSKSealer *seal.Sealer
	// ExpireGracePSKs, if set, is called when a validation met a grace PSK
	// whose grace has ended, to revoke it (and audit that).
	ExpireGracePSKs func(ctx context.Context)
	// PSKObserver, if set, is told the result of each PSK validation:
	// PSKResultActive, PSKResultGrace or PSKResultInvalid.
	PSKObserver func(result string)
	// Tickets, if set, checks referral tickets: a discovery service is
	// configured and every PSK bootstrap needs a ticket.
	Tickets TicketVerifier
	// PSKOptionalUntil, if set with Tickets, lets a bootstrap with a valid
	// ticket and no PSK join until then, by the store clock (the migration
	// window of bootstrap.psk_required: false).
	PSKOptionalUntil time.Time
	// TicketObserver, if set, is told the result of each ticket check
	// (TicketResult*).
	TicketObserver func(result string)
}

// pskMethod is the bootstrap-PSK Method; it reads the Service's PSKConfig.
type pskMethod struct{ s *Service }

// Attest implements Method.
func (m pskMethod) Attest(ctx context.Context, r Request, p PSKPayload, _ Challenge) (Admission, error) {
	s := m.s
	pskText, referralTicket, csrData := p.PSK, p.ReferralTicket, p.CSR
	var a Admission
	// 1. Fields well-formed.
	var given psk.PSK
	if pskText != "" {
		var err error
		if given, err = psk.Parse(pskText); err != nil {
			return a, refuse(KindInvalid, "bootstrap_psk: "+err.Error())
		}
	}
	if referralTicket != "" && s.cfg.Tickets == nil {
		return a, refuse(KindInvalid, reasonNoDiscovery)
	}
	if len(csrData) == 0 {
		return a, refuse(KindInvalid, "csr is required: its common name is the node ID")
	}
	csr, err := ca.ParseCSR(csrData)
	if err != nil {
		return a, refuse(KindInvalid, "csr: "+err.Error())
	}
	nodeID := csr.Subject.CommonName
	if err := spiffeid.ValidNodeID(nodeID); err != nil {
		return a, refuse(KindInvalid, "csr common name (the node ID): "+err.Error())
	}
	a.NodeID = nodeID
	kid, err := keyID(csr.PublicKey)
	if err != nil {
		return a, err
	}
	// 2. The source's rate limit.
	if s.cfg.Limiter != nil && !s.cfg.Limiter.Allow(r.Source) {
		return a, refuse(KindRateLimited, "too many requests from this source")
	}
	// 3. The referral ticket, when tickets are enforced.
	var ticket *referral.Claims
	if s.cfg.Tickets != nil {
		c, err := s.checkTicket(ctx, referralTicket, nodeID)
		if err != nil {
			return a, err
		}
		ticket = &c
	}
	// 4. The PSK matches, or may be left out.
	credential, proof, err := s.checkPSK(ctx, pskText, given, ticket)
	if err != nil {
		return a, err
	}
	if credential != CredentialTicketOnly {
		a.Actor = "psk:" + credential
	}
	if ticket != nil {
		proof += ", referral ticket " + ticket.ID
	}

	// 5. Node ID free, or a retry of the join that took it. The locks of
	// step 6 come in the same read: one round trip.
	now := s.cfg.Now()
	targets := store.Named([]store.LockTarget{{Kind: store.LockNode, Target: nodeID}, keyLock(kid)})
	rd, err := s.cfg.Store.ReadJoin(ctx, "", nodeID, targets)
	if err != nil {
		return a, err
	}
	if node := rd.Node; rd.NodeFound {
		if node.TokenID == credential {
			iss, err := s.retryJoin(ctx, node, credential, kid, now)
			if err != nil {
				return a, err
			}
			if iss != nil {
				a.Retry = iss
				return a, nil
			}
		}
		return a, refuse(KindAlreadyExists, ReasonNodeTaken).with("%s; %s", proof, nodeTakenWayOut(nodeID))
	}
	// The ticket's single use is written with the join, which refuses a
	// jti already recorded (store.ErrTicketReplayed): one round trip, and
	// the only check that holds against a concurrent replay. It is kept
	// past the last moment any replica accepts the ticket: the expiry
	// checks allow Leeway on a replica's clock, the cleaner runs on the
	// store's, and the two may differ by as much again.
	if ticket != nil {
		a.Ticket = &store.TicketUse{ID: ticket.ID, KeepUntil: ticket.Expiry.Add(2 * referral.Leeway)}
	}
	// 6. No lock on the node or the key to certify.
	if l := lockOf(rd); l != nil {
		return a, s.lockedOn(ctx, targets, *l, "%s, lock %s on %s %s", proof, l.ID, l.Kind, l.Target)
	}

	a.Credential, a.Proof, a.Method = credential, proof, store.JoinMethodPSK
	a.PublicKey, a.KeyID, a.Now, a.LockTargets = csr.PublicKey, kid, now, targets
	a.nodeFree = true // a node found returned above
	return a, nil
}

// checkTicket verifies a referral ticket for nodeID; its single use is
// checked later, with the join.
func (s *Service) checkTicket(ctx context.Context, token, nodeID string) (referral.Claims, error) {
	if token == "" {
		s.observeTicket(TicketResultMissing)
		return referral.Claims{}, refuse(KindPermissionDenied, ReasonTicketMissing)
	}
	c, err := s.cfg.Tickets.Verify(ctx, token, nodeID)
	var inv *referral.Invalid
	switch {
	case errors.As(err, &inv) && inv.Expired:
		s.observeTicket(TicketResultExpired)
		// A ticket the agent just asked for expires here only when
		// discovery's clock is behind this authority's by more than the
		// allowance: then a new one fares no better.
		return c, refuse(KindPermissionDenied, inv.Error()+": ask the discovery service for a new one; "+ticketClockWayOut)
	case errors.As(err, &inv) && inv.UnknownKey:
		// Its own reason word (ticket_key_unknown), so the agent asks
		// for a fresh ticket instead of stopping.
		s.observeTicket(TicketResultInvalid)
		return c, refuse(KindPermissionDenied, ReasonTicketKeyUnknown).with("%s", inv.Error())
	case errors.As(err, &inv):
		s.observeTicket(TicketResultInvalid)
		return c, refuse(KindPermissionDenied, inv.Error())
	case errors.Is(err, referral.ErrKeyNotFetched):
		// Most often a key discovery has just published, which one of
		// its replicas had not yet when this authority fetched: the
		// agent retries (UNAVAILABLE), by when the key is fetched.
		return c, refuse(KindUnavailable, ReasonTicketKeyNotFetched).with("%v", err)
	case err != nil:
		return c, refuse(KindUnavailable, reasonTicketKeys).with("%v", err)
	}
	return c, nil
}

// checkPSK matches the given PSK and returns the credential the join
// records (the PSK's ID, or CredentialTicketOnly) and the proof the audit
// record names. Without a PSK, a join passes only with a valid ticket
// before PSKOptionalUntil, by the store clock.
func (s *Service) checkPSK(ctx context.Context, pskText string, given psk.PSK, ticket *referral.Claims) (credential, proof string, err error) {
	if pskText == "" {
		if ticket != nil && !s.cfg.PSKOptionalUntil.IsZero() {
			now, err := s.cfg.Store.Now(ctx)
			if err != nil {
				return "", "", err
			}
			if now.Before(s.cfg.PSKOptionalUntil) {
				return CredentialTicketOnly, "no PSK (bootstrap.psk_optional_until " + s.cfg.PSKOptionalUntil.UTC().Format(time.RFC3339) + ")", nil
			}
		}
		s.observePSK(PSKResultInvalid)
		return "", "", refuse(KindPermissionDenied, ReasonPSKMissing).with("%s", pskMissingWayOut)
	}
	matched, err := s.matchPSK(ctx, given)
	if err != nil {
		return "", "", err
	}
	if matched.ID == "" {
		s.observePSK(PSKResultInvalid)
		return "", "", refuse(KindPermissionDenied, ReasonPSKMismatch).with("%s", pskMismatchWayOut)
	}
	s.observePSK(matched.Status)
	return matched.ID, fmt.Sprintf("psk %s (%s)", matched.ID, matched.Status), nil
}

// ticketClockWayOut ends the refusal of an expired ticket.
var ticketClockWayOut = fmt.Sprintf("if it was new, discovery's clock is more than %s behind this authority's: set both right (NTP)", referral.Leeway)

// The ways out of a PSK refusal, for its audit record (the agent adds
// the same to the line it ends with).
const (
	pskMissingWayOut  = "give the machine the PSK (--psk-file, MUSTER_BOOTSTRAP_PSK): muster psk show prints it"
	pskMismatchWayOut = "if the PSK was rotated (muster psk rotate), give this machine the active one: muster psk show prints it"
)

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
	ps, err := s.cfg.Store.ListPSKs(ctx)
	if err != nil {
		return store.PSK{}, err
	}
	// Only a grace PSK needs the store clock; most joins meet none.
	var now time.Time
	for _, p := range ps {
		if p.Status == store.PSKGrace {
			if now, err = s.cfg.Store.Now(ctx); err != nil {
				return store.PSK{}, err
			}
			break
		}
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

func (s *Service) observeTicket(result string) {
	if s.cfg.TicketObserver != nil {
		s.cfg.TicketObserver(result)
	}
}
