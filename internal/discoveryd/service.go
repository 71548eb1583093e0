package discoveryd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/referral"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// service implements musterv1.DiscoveryServiceServer.
type service struct {
	musterv1.UnimplementedDiscoveryServiceServer
	s *Server
}

// RegisterAuthority records or updates an authority's entry: the
// allow-list for the ID, structure, signature, the allow-list for the root,
// then the store's rules (root lock, versions up only).
func (h *service) RegisterAuthority(ctx context.Context, req *musterv1.RegisterAuthorityRequest) (*musterv1.RegisterAuthorityResponse, error) {
	s := h.s
	c := s.newCall(ctx, "RegisterAuthority")
	resp, result, err := s.register(ctx, c, req)
	s.metrics.registrations.WithLabelValues(result).Inc()
	if err != nil {
		return nil, s.refuseAudited(ctx, c, "authority.register", req.GetAuthorityId(), err)
	}
	return resp, nil
}

func (s *Server) register(ctx context.Context, c call, req *musterv1.RegisterAuthorityRequest) (*musterv1.RegisterAuthorityResponse, string, error) {
	if err := s.allowSource(c, s.sourceLimit); err != nil {
		return nil, "rate_limited", err
	}
	if err := checkAuthorityID(req.GetAuthorityId()); err != nil {
		return nil, "invalid", err
	}
	// An ID nobody allowed is refused before any signature is checked.
	if err := s.allow.CheckID(req.GetAuthorityId()); err != nil {
		result, err := notAllowed(err)
		return nil, result, err
	}
	reg := discovery.Registration{
		AuthorityID:          req.GetAuthorityId(),
		Endpoints:            req.GetEndpoints(),
		CABundlePEM:          req.GetCaBundlePem(),
		Policy:               json.RawMessage(req.GetPolicyJson()),
		Version:              req.GetVersion(),
		PolicyCertificatePEM: req.GetPolicyCertificatePem(),
	}
	v, err := reg.Verify(req.GetSignature())
	if err != nil {
		if errors.Is(err, discovery.ErrRootNotLinked) {
			// Signed by the authority's policy key, yet naming a root its
			// own root never certified: never served, the lock unmoved.
			return nil, resultRootNotLinked, refuse(codes.PermissionDenied, resultRootNotLinked,
				"%s; discovery takes a new root of %s only through a cross-certificate from the root it is locked to, %s (muster ca root rotate makes one)",
				err, reg.AuthorityID, lockedRoot(reg))
		}
		if registrationDenied(reg, err) {
			return nil, "denied", refuse(codes.PermissionDenied, "denied", "%s", err)
		}
		return nil, "invalid", refuse(codes.InvalidArgument, "invalid", "%s", err)
	}
	// Before anything is written: an ID listed with another root stays
	// free for its own.
	if err := s.allow.Check(v.AuthorityID, v.Fingerprint); err != nil {
		result, err := notAllowed(err)
		return nil, result, err
	}
	// A registration that changes anything is written with its
	// authority.register record, or not at all; a repeat changes nothing
	// and is not recorded: authorities repeat theirs every few minutes.
	var link *audit.Link
	stored, changed, err := s.store.PutRegistration(ctx, store.Registration{
		AuthorityID:     v.AuthorityID,
		RootFingerprint: v.Fingerprint,
		Version:         v.Version,
		Document:        v.Document,
		Signature:       req.GetSignature(),
	}, func(stored store.Registration) func(store.AuditHead) (store.AuditRecord, error) {
		e := audit.Event{Actor: v.AuthorityID, Action: "authority.register",
			Target: v.AuthorityID, Result: audit.ResultOK, Source: c.src(), CorrelationID: c.correlationID,
			Reason: fmt.Sprintf("%s version %d, root %s, endpoints %s", registerResult(stored, v.Version), v.Version, v.Fingerprint, strings.Join(v.Endpoints, ","))}
		var err error
		if link, err = s.audit.Builder(e); err != nil {
			return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, err }
		}
		return link.Build
	})
	switch {
	case errors.Is(err, store.ErrRootMismatch):
		locked := "another root"
		if cur, gerr := s.store.GetRegistration(ctx, v.AuthorityID); gerr == nil {
			locked = cur.RootFingerprint
		}
		return nil, "root_mismatch", refuse(codes.PermissionDenied, "root_mismatch",
			"authority ID %s is locked to root fingerprint %s; this registration is signed under %s (if the registered root is not the authority's, remove it with muster discovery forget %s)",
			v.AuthorityID, locked, v.Fingerprint, v.AuthorityID)
	case errors.Is(err, store.ErrStaleVersion):
		cur := "a newer one"
		if r, gerr := s.store.GetRegistration(ctx, v.AuthorityID); gerr == nil {
			cur = fmt.Sprintf("version %d", r.Version)
		}
		return nil, "stale_version", refuse(codes.FailedPrecondition, "stale_version",
			"registration version %d of %s is not newer than the registered %s (versions only go up; the same version must repeat the same document)",
			v.Version, v.AuthorityID, cur)
	case err != nil:
		return nil, "error", err
	}
	result := resultUnchanged
	if changed {
		result = registerResult(stored, v.Version)
		s.audit.Appended(link)
		s.log.Info("authority registered", "authority_id", v.AuthorityID, "version", v.Version, "result", result, "endpoints", v.Endpoints)
	}
	return &musterv1.RegisterAuthorityResponse{Version: stored.Version, CaFingerprint: stored.RootFingerprint, Changed: changed}, result, nil
}

// lockedRoot is the fingerprint of a registration's anchor, as far as
// it parses.
func lockedRoot(reg discovery.Registration) string {
	if r, err := discovery.ParseRoots(reg.CABundlePEM); err == nil {
		return ca.Fingerprint(r.Anchor)
	}
	return "the root its ID names"
}

// registrationDenied tells a registration refused because its signer has
// no right to it (the signature, the policy certificate, or an authority
// ID that names another root: PERMISSION_DENIED) from a malformed one
// (INVALID_ARGUMENT). Verify checks structure first, so a failure is a
// question of rights only when the structure it needs is sound.
func registrationDenied(reg discovery.Registration, err error) bool {
	if errors.Is(err, discovery.ErrSignature) {
		return true
	}
	bundle, perr := ca.ParseCertsPEM([]byte(reg.CABundlePEM))
	if perr != nil || !bundle[0].IsCA || bundle[0].CheckSignatureFrom(bundle[0]) != nil {
		return false
	}
	root := bundle[0]
	if discovery.CheckAuthorityID(reg.AuthorityID, ca.Fingerprint(root)) != nil {
		// The form was checked before Verify: the ID names another root.
		return true
	}
	certs, perr := ca.ParseCertsPEM([]byte(reg.PolicyCertificatePEM))
	return perr == nil && len(certs) == 1 && discovery.CheckPolicyCertificate(certs[0], root) != nil
}

// ReportJoin counts a join a referral ticket led to, once per instance.
func (h *service) ReportJoin(ctx context.Context, req *musterv1.ReportJoinRequest) (*musterv1.ReportJoinResponse, error) {
	s := h.s
	c := s.newCall(ctx, "ReportJoin")
	recorded, result, err := s.reportJoin(ctx, c, req)
	s.metrics.reports.WithLabelValues(result).Inc()
	if err != nil {
		return nil, s.refuseAudited(ctx, c, "join.report", req.GetAuthorityId()+" "+req.GetNodeId(), err)
	}
	return &musterv1.ReportJoinResponse{Recorded: recorded}, nil
}

func (s *Server) reportJoin(ctx context.Context, c call, req *musterv1.ReportJoinRequest) (bool, string, error) {
	if err := s.allowSource(c, s.reportLimit); err != nil {
		return false, "rate_limited", err
	}
	if err := checkAuthorityID(req.GetAuthorityId()); err != nil {
		return false, "invalid", err
	}
	if req.GetJoinedAt() == nil || req.GetJoinedAt().CheckValid() != nil {
		return false, "invalid", refuse(codes.InvalidArgument, "invalid", "join report: joined_at is required")
	}
	_, v, err := s.registration(ctx, req.GetAuthorityId())
	if err != nil {
		var r *refusal
		if errors.As(err, &r) {
			return false, discovery.DenyUnknown, err
		}
		return false, "error", err
	}
	jr := discovery.JoinReport{AuthorityID: req.GetAuthorityId(), NodeID: req.GetNodeId(), InstanceID: req.GetInstanceId(),
		TicketID: req.GetTicketId(), JoinedAt: req.GetJoinedAt().AsTime()}
	if err := jr.Verify(v.PolicyCert, req.GetSignature()); err != nil {
		if errors.Is(err, discovery.ErrSignature) {
			return false, "denied", refuse(codes.PermissionDenied, "denied", "%s (signed with a key other than the policy signing key registered for %s)", err, jr.AuthorityID)
		}
		return false, "invalid", refuse(codes.InvalidArgument, "invalid", "%s", err)
	}
	inserted, err := s.store.RecordJoinReport(ctx, store.JoinReport{AuthorityID: jr.AuthorityID, ReportID: jr.InstanceID,
		NodeID: jr.NodeID, TicketID: jr.TicketID, JoinedAt: jr.JoinedAt})
	if err != nil {
		return false, "error", err
	}
	if !inserted {
		return false, resultDuplicate, nil
	}
	return true, resultRecorded, nil
}

// registerResult says whether the registration stored at version was
// created or updated.
func registerResult(stored store.Registration, version int64) string {
	if stored.Version == version && stored.RegisteredAt.Equal(stored.UpdatedAt) {
		return resultCreated
	}
	return resultUpdated
}

// LookupAuthority answers an authority's registered entry; public.
func (h *service) LookupAuthority(ctx context.Context, req *musterv1.LookupAuthorityRequest) (*musterv1.LookupAuthorityResponse, error) {
	s := h.s
	c := s.newCall(ctx, "LookupAuthority")
	resp, err := s.lookup(ctx, c, req)
	if err != nil {
		return nil, s.refuseAudited(ctx, c, "authority.lookup", req.GetAuthorityId(), err)
	}
	return resp, nil
}

func (s *Server) lookup(ctx context.Context, c call, req *musterv1.LookupAuthorityRequest) (*musterv1.LookupAuthorityResponse, error) {
	if err := checkAuthorityID(req.GetAuthorityId()); err != nil {
		return nil, err
	}
	if err := s.allowSource(c, s.sourceLimit); err != nil {
		return nil, err
	}
	reg, v, err := s.registration(ctx, req.GetAuthorityId())
	if err != nil {
		return nil, err
	}
	return &musterv1.LookupAuthorityResponse{
		AuthorityId:   reg.AuthorityID,
		Endpoints:     v.Endpoints,
		CaBundlePem:   v.CABundlePEM,
		CaFingerprint: reg.RootFingerprint,
		Version:       reg.Version,
		PolicyJson:    string(v.CanonicalPolicy),
		UpdatedAt:     timestamppb.New(reg.UpdatedAt),
	}, nil
}

// RequestReferralTicket hands out a ticket within the authority's policy.
// The checks run in the order DESIGN.md gives them, cheapest and least
// revealing first.
func (h *service) RequestReferralTicket(ctx context.Context, req *musterv1.RequestReferralTicketRequest) (*musterv1.RequestReferralTicketResponse, error) {
	s := h.s
	c := s.newCall(ctx, "RequestReferralTicket")
	resp, err := s.ticket(ctx, c, req)
	if err != nil {
		reason := "error"
		var r *refusal
		if errors.As(err, &r) {
			reason = r.reason
		}
		s.metrics.denied.WithLabelValues(reason).Inc()
		return nil, s.refuseAudited(ctx, c, "referral_ticket.issue", "authority "+req.GetAuthorityId()+" node "+req.GetNodeId(), err)
	}
	s.metrics.issued.Inc()
	return resp, nil
}

func (s *Server) ticket(ctx context.Context, c call, req *musterv1.RequestReferralTicketRequest) (*musterv1.RequestReferralTicketResponse, error) {
	authorityID, nodeID := req.GetAuthorityId(), req.GetNodeId()
	if err := checkAuthorityID(authorityID); err != nil {
		return nil, err
	}
	if err := spiffeid.NameError("node ID", "node", nodeID); err != nil {
		return nil, refuse(codes.InvalidArgument, discovery.DenyInvalid, "%s: %v", discovery.DenyInvalid, err)
	}
	if err := s.allowSource(c, s.sourceLimit); err != nil {
		return nil, err
	}
	_, v, err := s.registration(ctx, authorityID)
	if err != nil {
		return nil, err
	}
	policy := v.ParsedPolicy
	if err := policy.Admit(c.source, nodeID); err != nil {
		var d *discovery.Denial
		if errors.As(err, &d) {
			code := codes.PermissionDenied
			if d.Reason == discovery.DenyInvalid {
				code = codes.InvalidArgument
			}
			return nil, refuse(code, d.Reason, "%s: %s", d.Reason, d.Detail)
		}
		return nil, err
	}
	rl := policy.RateLimits
	for _, b := range []struct {
		key  string
		r    discovery.Rate
		name string
	}{
		{authorityID + "|" + nodeID + "|" + c.src(), rl.PerNodeSource, "per node and source"},
		{authorityID + "|" + c.src(), rl.PerSource, "per source"},
		{authorityID, rl.PerAuthority, "per authority"},
	} {
		if !s.policy.AllowRate(b.key, rate.Limit(float64(b.r.PerMinute)/60), int(b.r.Burst)) {
			return nil, refuse(codes.ResourceExhausted, discovery.DenyRateLimit, "%s: authority %s allows %d tickets a minute %s (burst %d); retry later",
				discovery.DenyRateLimit, authorityID, b.r.PerMinute, b.name, b.r.Burst)
		}
	}
	if quota := policy.NewAgentsPerDay; quota > 0 {
		n, err := s.store.CountJoinReports(ctx, authorityID, 24*time.Hour)
		if err != nil {
			return nil, err
		}
		if n >= quota {
			return nil, refuse(codes.ResourceExhausted, discovery.DenyQuota, "%s: authority %s has admitted its %d new agents of the last 24 hours; retry later, or raise discovery.policy.new_agents_per_day in the authority's configuration",
				discovery.DenyQuota, authorityID, quota)
		}
	}
	key, err := s.keys.current(ctx)
	if err != nil {
		return nil, err
	}
	// Whole seconds, as the JWT carries them, so exp - iat is exactly
	// the ticket's lifetime.
	now := s.now().Truncate(time.Second)
	claims := referral.Claims{
		Issuer:      s.Issuer(),
		AuthorityID: authorityID,
		NodeID:      nodeID,
		SourceIP:    c.src(),
		ID:          referral.NewID(),
		IssuedAt:    now,
		Expiry:      now.Add(referral.TTL),
	}
	tok, err := referral.Issue(key.key, key.id, claims)
	if err != nil {
		return nil, err
	}
	s.log.Info("referral ticket issued", "authority_id", authorityID, "node", nodeID, "source", c.src(), "jti", claims.ID, "key", key.id)
	return &musterv1.RequestReferralTicketResponse{Ticket: tok, ExpiresAt: timestamppb.New(claims.Expiry)}, nil
}
