package discoveryd

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/google/uuid"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/store"
)

// call is one request: who sent it, for the rate limits and the audit log.
type call struct {
	method        string
	source        netip.Addr
	correlationID string
}

func (s *Server) newCall(ctx context.Context, method string) call {
	return call{method: method, source: sourceOf(ctx), correlationID: correlationID(ctx)}
}

// src is the source as the audit log and the limiter keys write it.
func (c call) src() string {
	if !c.source.IsValid() {
		return "unknown"
	}
	return c.source.String()
}

// sourceOf is the TCP peer's address.
func sourceOf(ctx context.Context) netip.Addr {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
		return ap.Addr().Unmap()
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		if a, err := netip.ParseAddr(host); err == nil {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}

const correlationHeader = "x-correlation-id"

// correlationID takes the caller's ID when it is a plausible one and
// makes one otherwise.
func correlationID(ctx context.Context) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(correlationHeader); len(v) == 1 && validCorrelationID(v[0]) {
			return v[0]
		}
	}
	return uuid.NewString()
}

func validCorrelationID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// refuseAudited writes a refusal to the audit log, through the flood
// guard, and returns the error the caller sees.
func (s *Server) refuseAudited(ctx context.Context, c call, action, target string, err error) error {
	reason := err.Error()
	var r *refusal
	if !errors.As(err, &r) {
		reason = "internal error"
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
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || len(id)-i-1 != 6 || ca.ValidName(id[:i]) != nil || strings.ToLower(id[i+1:]) != id[i+1:] {
		return refuse(codes.InvalidArgument, discovery.DenyInvalid, "%s: authority ID %q is not NAME-HEX6 (as muster init prints it)", discovery.DenyInvalid, id)
	}
	if _, err := hex.DecodeString(id[i+1:]); err != nil {
		return refuse(codes.InvalidArgument, discovery.DenyInvalid, "%s: authority ID %q is not NAME-HEX6 (as muster init prints it)", discovery.DenyInvalid, id)
	}
	return nil
}

// registration returns an authority's registration as verified when it
// was stored; a *refusal (NOT_FOUND, unknown_authority) if there is none.
func (s *Server) registration(ctx context.Context, authorityID string) (store.Registration, *discovery.Verified, error) {
	reg, err := s.store.GetRegistration(ctx, authorityID)
	if errors.Is(err, store.ErrNotFound) {
		return reg, nil, refuse(codes.NotFound, discovery.DenyUnknown, "%s: authority %s is not registered with this discovery", discovery.DenyUnknown, authorityID)
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

// policyCache keeps parsed registrations by authority ID and version
// (which the store ties to one document), so a ticket request does not
// parse certificates and compile patterns again. Safe for concurrent use.
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
	if ok {
		return v, nil
	}
	v, err := discovery.ParseStored(reg.Document)
	if err != nil {
		return nil, err
	}
	if v.AuthorityID != reg.AuthorityID || v.Version != reg.Version {
		return nil, errors.New("the stored document names another authority or version")
	}
	p.mu.Lock()
	if len(p.m) >= policyCacheSize {
		clear(p.m)
	}
	p.m[key] = v
	p.mu.Unlock()
	return v, nil
}
