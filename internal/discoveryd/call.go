package discoveryd

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/callinfo"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/store"
)

// call is one request: who sent it, for the rate limits and the audit log.
type call struct {
	method string
	// source is the client's address: the TCP peer, or the client a
	// trusted proxy named (Config.TrustedProxies).
	source        netip.Addr
	correlationID string
}

func (s *Server) newCall(ctx context.Context, method string) call {
	return call{method: method, source: callinfo.Source(ctx), correlationID: callinfo.CorrelationID(ctx)}
}

// src is the source as the audit log and the limiter keys write it.
func (c call) src() string {
	if !c.source.IsValid() {
		return "unknown"
	}
	return c.source.String()
}

// refuseAudited writes a refusal to the audit log, through the flood
// guard, and returns the error the caller sees.
func (s *Server) refuseAudited(ctx context.Context, c call, action, target string, err error) error {
	reason := err.Error()
	var r *refusal
	switch {
	case !errors.As(err, &r):
		reason = "internal error"
	case r.audit != "":
		reason = r.audit
	}
	s.refusals.Record(ctx, audit.Event{Actor: "anonymous", Action: action, Target: target, Result: audit.ResultDenied,
		Reason: reason, Source: c.src(), CorrelationID: c.correlationID})
	return toStatus(s.log, c.method, c.correlationID, err)
}

// bucket is a token bucket's rate and burst.
type bucket struct {
	rate  rate.Limit
	burst int
}

// allowSource takes a token from the source's bucket of one RPC.
func (s *Server) allowSource(c call, b bucket) error {
	if !s.limiter.AllowRate(c.method+"|"+c.src(), b.rate, b.burst) {
		return refuse(codes.ResourceExhausted, discovery.DenyRateLimit, "%s: too many requests from %s; retry later", discovery.DenyRateLimit, c.src())
	}
	return nil
}

// checkAuthorityID checks the form NAME-HEX6 of an authority ID, before
// anything is looked up.
func checkAuthorityID(id string) error {
	if err := discovery.ValidAuthorityID(id); err != nil {
		return refuse(codes.InvalidArgument, discovery.DenyInvalid, "%s: %s", discovery.DenyInvalid, strings.TrimPrefix(err.Error(), "discovery: "))
	}
	return nil
}

// registration returns an authority's registration as verified when it
// was stored; a *refusal (NOT_FOUND, unknown_authority) if there is none,
// or if the allow-list no longer admits its ID and root (a registration
// stored before the list, or under open registration, is not served once
// the list names its ID with another root, or no longer names it).
func (s *Server) registration(ctx context.Context, authorityID string) (store.Registration, *discovery.Verified, error) {
	reg, err := s.store.GetRegistration(ctx, authorityID)
	// One answer, to an anonymous caller, for an ID never registered and
	// for one registered but not admitted: told apart, the answer would
	// tell anyone which IDs discovery holds a registration of that its
	// allow-list keeps out (a squatter's, an authority dropped from the
	// list). It names every way out; the audit record says which applies.
	unknown := func() *refusal {
		return refuse(codes.NotFound, discovery.DenyUnknown,
			"%s: authority %s is not registered with this discovery: check the authority ID (muster init printed it), "+
				"that the authority runs with --discovery naming this discovery (its log says why a registration is refused), "+
				"and that discovery's allow-list admits it (--allow-authority %s=sha256:…; discovery's audit log of this refusal says which applies)",
			discovery.DenyUnknown, authorityID, authorityID)
	}
	if err == nil {
		if cerr := s.allow.Check(reg.AuthorityID, reg.RootFingerprint); cerr != nil {
			// Stored, but the list no longer admits it. The fingerprint
			// to allow is the authority operator's, never the
			// registration's (docs/discovery.md).
			if na := (*discovery.NotAllowedError)(nil); errors.As(cerr, &na) && na.Allowed != "" {
				// The list names the ID with another root: the stored
				// registration is not the listed authority's (a
				// squatter's under open registration, or the root
				// before a restore); forgotten, the listed authority
				// registers again.
				return reg, nil, unknown().withAudit("%s: authority %s is registered here under root %s, but this discovery's allow-list names it with %s, "+
					"so it is not served: if %s is the authority's root (ask its operator), muster discovery forget %s --data DIR deletes the stored registration "+
					"and the authority registers again within its re-registration period (10 minutes by default) or at its next start; otherwise correct the allow-list entry",
					discovery.DenyUnknown, authorityID, reg.RootFingerprint, na.Allowed, na.Allowed, authorityID)
			}
			return reg, nil, unknown().withAudit("%s: authority %s is registered here but this discovery's allow-list does not admit it, "+
				"so it is not served: start discovery with --allow-authority %s=sha256:… (the ca_fingerprint muster init printed for it), "+
				"or list it so under allowed_authorities in discovery.yaml", discovery.DenyUnknown, authorityID, authorityID)
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return reg, nil, unknown()
	}
	if err != nil {
		return reg, nil, err
	}
	v, err := s.policies.get(reg)
	if err != nil {
		return reg, nil, fmt.Errorf("discoveryd: stored registration of %s: %w", authorityID, err)
	}
	return reg, v, nil
}

// policyCache keeps parsed registrations by authority ID and version, so
// a ticket request does not parse certificates and compile patterns
// again. The store ties a version to one document only while the
// registration lives: after muster discovery forget, the ID may register
// again from version 1 with another document, so a hit counts only for
// the same document. Safe for concurrent use.
type policyCache struct {
	mu sync.Mutex
	m  map[string]*discovery.Verified
}

const policyCacheSize = 4096

func newPolicyCache() *policyCache { return &policyCache{m: map[string]*discovery.Verified{}} }

func (p *policyCache) get(reg store.Registration) (*discovery.Verified, error) {
	key := fmt.Sprintf("%s@%d", reg.AuthorityID, reg.Version)
	p.mu.Lock()
	v, ok := p.m[key]
	p.mu.Unlock()
	if ok && string(v.Document) == string(reg.Document) {
		return v, nil
	}
	v, err := discovery.ParseStored(reg.Document)
	if err != nil {
		return nil, err
	}
	if v.AuthorityID != reg.AuthorityID || v.Version != reg.Version || v.Fingerprint != reg.RootFingerprint {
		return nil, errors.New("the stored document names another authority, version or root")
	}
	p.mu.Lock()
	if len(p.m) >= policyCacheSize {
		clear(p.m)
	}
	p.m[key] = v
	p.mu.Unlock()
	return v, nil
}
