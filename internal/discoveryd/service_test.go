package discoveryd

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/referral"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// wantCode fails unless err carries code and, for a refusal, a message
// containing msg.
func wantCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("error = %v, want %v", err, code)
	}
	if msg != "" && !strings.Contains(status.Convert(err).Message(), msg) {
		t.Fatalf("message %q, want it to contain %q", status.Convert(err).Message(), msg)
	}
}

func TestRegisterAuthority(t *testing.T) {
	a, other := newAuthority(t, "prod"), newAuthority(t, "other")
	policy := openPolicy()
	reg := func(version int64) discovery.Registration {
		return discovery.Registration{AuthorityID: a.id, Endpoints: []string{"a.example:7443"},
			CABundlePEM: string(ca.EncodeCertPEM(a.h.Root)), Policy: policyJSON(t, policy), Version: version}
	}
	signedBy := func(r discovery.Registration, i *ca.Issuer) *musterv1.RegisterAuthorityRequest {
		return a.sign(t, r, i)
	}
	ownKey := a.h.Issuer(ca.RolePolicy)

	tests := []struct {
		name string
		// before are registrations sent first, each expected to succeed.
		before      []*musterv1.RegisterAuthorityRequest
		req         *musterv1.RegisterAuthorityRequest
		code        codes.Code
		msg         string
		wantChanged bool
		wantVersion int64
	}{
		{name: "new", req: signedBy(reg(1), ownKey), wantChanged: true, wantVersion: 1},
		{name: "repeat", before: []*musterv1.RegisterAuthorityRequest{signedBy(reg(1), ownKey)}, req: signedBy(reg(1), ownKey), wantVersion: 1},
		{name: "higher version", before: []*musterv1.RegisterAuthorityRequest{signedBy(reg(1), ownKey)}, req: signedBy(reg(5), ownKey), wantChanged: true, wantVersion: 5},
		{name: "lower version", before: []*musterv1.RegisterAuthorityRequest{signedBy(reg(5), ownKey)}, req: signedBy(reg(4), ownKey),
			code: codes.FailedPrecondition, msg: "not newer than the registered version 5"},
		{name: "same version, another document", before: []*musterv1.RegisterAuthorityRequest{signedBy(reg(2), ownKey)},
			req: func() *musterv1.RegisterAuthorityRequest {
				r := reg(2)
				r.Endpoints = []string{"b.example:7443"}
				return signedBy(r, ownKey)
			}(), code: codes.FailedPrecondition, msg: "versions only go up"},
		{name: "signature by another key", req: func() *musterv1.RegisterAuthorityRequest {
			r := reg(1)
			r.PolicyCertificatePEM = string(ca.EncodeCertPEM(ownKey.Cert))
			_, sig, err := r.Sign(other.h.Issuer(ca.RolePolicy).Key)
			if err != nil {
				t.Fatal(err)
			}
			return requestOf(r, sig)
		}(), code: codes.PermissionDenied, msg: "signature does not verify"},
		{name: "policy certificate of another root", req: signedBy(reg(1), other.h.Issuer(ca.RolePolicy)),
			code: codes.PermissionDenied, msg: "not issued by the root"},
		{name: "signed by an intermediate, not the policy certificate", req: signedBy(reg(1), a.h.Issuer(ca.RoleServer)),
			code: codes.PermissionDenied, msg: "not a policy signing certificate"},
		{name: "authority ID of another root", req: func() *musterv1.RegisterAuthorityRequest {
			r := reg(1)
			r.AuthorityID = other.id
			return signedBy(r, ownKey)
		}(), code: codes.PermissionDenied, msg: "does not match its root"},
		{name: "malformed authority ID", req: func() *musterv1.RegisterAuthorityRequest {
			r := reg(1)
			r.AuthorityID = "Prod"
			return signedBy(r, ownKey)
		}(), code: codes.InvalidArgument, msg: "NAME-HEX6"},
		{name: "version 0", req: signedBy(reg(0), ownKey), code: codes.InvalidArgument, msg: "version"},
		{name: "no endpoint", req: func() *musterv1.RegisterAuthorityRequest {
			r := reg(1)
			r.Endpoints = nil
			return signedBy(r, ownKey)
		}(), code: codes.InvalidArgument, msg: "endpoints"},
		{name: "endpoint without port", req: func() *musterv1.RegisterAuthorityRequest {
			r := reg(1)
			r.Endpoints = []string{"a.example"}
			return signedBy(r, ownKey)
		}(), code: codes.InvalidArgument, msg: "HOST:PORT"},
		{name: "no CA bundle", req: func() *musterv1.RegisterAuthorityRequest {
			r := reg(1)
			r.CABundlePEM = "junk"
			return signedBy(r, ownKey)
		}(), code: codes.InvalidArgument, msg: "ca_bundle_pem"},
		{name: "bundle starting with an intermediate", req: func() *musterv1.RegisterAuthorityRequest {
			r := reg(1)
			r.CABundlePEM = string(ca.EncodeCertPEM(a.h.Issuer(ca.RoleServer).Cert))
			return signedBy(r, ownKey)
		}(), code: codes.InvalidArgument, msg: "not a self-signed CA"},
		{name: "policy with an unknown field, signed", req: func() *musterv1.RegisterAuthorityRequest {
			r := reg(1)
			r.Policy = json.RawMessage(`{"rate_limits":{},"new_agents_per_day":0,"surprise":1}`)
			return signedBy(r, ownKey)
		}(), code: codes.InvalidArgument, msg: "unknown field"},
		{name: "policy not JSON", req: func() *musterv1.RegisterAuthorityRequest {
			r := requestOf(reg(1), nil)
			r.PolicyJson = "{"
			return r
		}(), code: codes.InvalidArgument, msg: "policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := start(t)
			for _, b := range tt.before {
				if _, err := e.client.RegisterAuthority(ctxT(t), b); err != nil {
					t.Fatalf("registration before: %v", err)
				}
			}
			resp, err := e.client.RegisterAuthority(ctxT(t), tt.req)
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.msg)
				return
			}
			if err != nil {
				t.Fatalf("RegisterAuthority: %v", err)
			}
			if resp.GetChanged() != tt.wantChanged || resp.GetVersion() != tt.wantVersion || resp.GetCaFingerprint() != a.h.Fingerprint() {
				t.Errorf("response %+v, want changed %v, version %d, fingerprint %s", resp, tt.wantChanged, tt.wantVersion, a.h.Fingerprint())
			}
		})
	}
}

func TestRegisterAuthorityRootLock(t *testing.T) {
	e := start(t)
	a := newAuthority(t, "prod")
	// Two roots cannot share an authority ID short of a collision of the
	// first 24 bits of their fingerprints, so the lock is set up in the
	// store directly, as if such a root had registered first.
	locked := "sha256:" + strings.Repeat("ab", 32)
	if _, _, err := e.st.PutRegistration(ctxT(t), store.Registration{AuthorityID: a.id, RootFingerprint: locked, Version: 1,
		Document: []byte(`{}`), Signature: []byte("x")}, func(store.Registration) func(store.AuditHead) (store.AuditRecord, error) { return setupLink }); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.RegisterAuthority(ctxT(t), a.registration(t, 2, openPolicy()))
	wantCode(t, err, codes.PermissionDenied, "authority ID "+a.id+" is locked to root fingerprint "+locked)
	if got := counter(e.srv.metrics.registrations.WithLabelValues("root_mismatch")); got != 1 {
		t.Errorf("registrations{root_mismatch} = %v, want 1", got)
	}
}

func TestRegisterAuthorityRateLimited(t *testing.T) {
	e := start(t, func(s *Server) { s.sourceLimit = bucket{0.001, 2} })
	a := newAuthority(t, "prod")
	req := a.registration(t, 1, openPolicy())
	for i := range 2 {
		if _, err := e.client.RegisterAuthority(ctxT(t), req); err != nil {
			t.Fatalf("registration %d: %v", i, err)
		}
	}
	_, err := e.client.RegisterAuthority(ctxT(t), req)
	wantCode(t, err, codes.ResourceExhausted, "rate_limited")
	// Each RPC has its own bucket: a lookup still passes.
	if _, err := e.client.LookupAuthority(ctxT(t), &musterv1.LookupAuthorityRequest{AuthorityId: a.id}); err != nil {
		t.Errorf("LookupAuthority after registrations ran out: %v", err)
	}
}

func TestLookupAuthority(t *testing.T) {
	e := start(t)
	a := newAuthority(t, "prod")
	p := openPolicy()
	p.AllowedCIDRs = []string{"10.0.0.0/8"}
	req := a.registration(t, 3, p, "a.example:7443", "10.1.2.3:7443")
	// The policy as the authority sent it, with its own spacing: lookup
	// answers the canonical form.
	req.PolicyJson = " " + req.PolicyJson
	reg := discovery.Registration{AuthorityID: req.AuthorityId, Endpoints: req.Endpoints, CABundlePEM: req.CaBundlePem,
		Policy: json.RawMessage(req.PolicyJson), Version: req.Version, PolicyCertificatePEM: req.PolicyCertificatePem}
	_, sig, err := reg.Sign(a.h.Issuer(ca.RolePolicy).Key)
	if err != nil {
		t.Fatal(err)
	}
	req.Signature = sig
	before := time.Now().Add(-time.Second)
	if _, err := e.client.RegisterAuthority(ctxT(t), req); err != nil {
		t.Fatal(err)
	}
	canonical, _ := p.Canonical()

	tests := []struct {
		name string
		id   string
		code codes.Code
		msg  string
	}{
		{name: "registered", id: a.id},
		{name: "unknown", id: "nobody-abcdef", code: codes.NotFound, msg: "unknown_authority"},
		{name: "malformed", id: "not an id", code: codes.InvalidArgument, msg: "NAME-HEX6"},
		{name: "upper-case hex", id: strings.ToUpper(a.id), code: codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := e.client.LookupAuthority(ctxT(t), &musterv1.LookupAuthorityRequest{AuthorityId: tt.id})
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.msg)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetAuthorityId() != a.id || strings.Join(resp.GetEndpoints(), " ") != "a.example:7443 10.1.2.3:7443" ||
				resp.GetCaBundlePem() != string(ca.EncodeCertPEM(a.h.Root)) || resp.GetCaFingerprint() != a.h.Fingerprint() ||
				resp.GetVersion() != 3 || resp.GetPolicyJson() != string(canonical) {
				t.Errorf("lookup = %+v", resp)
			}
			if u := resp.GetUpdatedAt().AsTime(); u.Before(before) || u.After(time.Now().Add(time.Second)) {
				t.Errorf("updated_at %v, want about now", u)
			}
		})
	}
}

func TestReportJoin(t *testing.T) {
	a, other := newAuthority(t, "prod"), newAuthority(t, "other")
	tests := []struct {
		name string
		// reqs are sent in order; the last one is checked.
		reqs         func(t *testing.T) []*musterv1.ReportJoinRequest
		code         codes.Code
		msg          string
		wantRecorded bool
	}{
		{name: "first report", wantRecorded: true, reqs: func(t *testing.T) []*musterv1.ReportJoinRequest {
			return []*musterv1.ReportJoinRequest{a.report(t, "node-1", "inst-1")}
		}},
		{name: "replayed report", reqs: func(t *testing.T) []*musterv1.ReportJoinRequest {
			r := a.report(t, "node-1", "inst-1")
			return []*musterv1.ReportJoinRequest{r, r}
		}},
		{name: "unknown authority", code: codes.NotFound, msg: "not registered", reqs: func(t *testing.T) []*musterv1.ReportJoinRequest {
			return []*musterv1.ReportJoinRequest{other.report(t, "node-1", "inst-1")}
		}},
		{name: "signed by another authority", code: codes.PermissionDenied, msg: "signature", reqs: func(t *testing.T) []*musterv1.ReportJoinRequest {
			r := other.report(t, "node-1", "inst-1")
			r.AuthorityId = a.id
			return []*musterv1.ReportJoinRequest{r}
		}},
		{name: "field changed after signing", code: codes.PermissionDenied, msg: "signature", reqs: func(t *testing.T) []*musterv1.ReportJoinRequest {
			r := a.report(t, "node-1", "inst-1")
			r.InstanceId = "inst-2"
			return []*musterv1.ReportJoinRequest{r}
		}},
		{name: "no instance", code: codes.InvalidArgument, msg: "instance_id", reqs: func(t *testing.T) []*musterv1.ReportJoinRequest {
			return []*musterv1.ReportJoinRequest{a.report(t, "node-1", "")}
		}},
		{name: "bad node ID", code: codes.InvalidArgument, msg: "node ID", reqs: func(t *testing.T) []*musterv1.ReportJoinRequest {
			return []*musterv1.ReportJoinRequest{a.report(t, "Node_1", "inst-1")}
		}},
		{name: "no time", code: codes.InvalidArgument, msg: "joined_at", reqs: func(t *testing.T) []*musterv1.ReportJoinRequest {
			r := a.report(t, "node-1", "inst-1")
			r.JoinedAt = nil
			return []*musterv1.ReportJoinRequest{r}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := start(t)
			e.register(a, 1, openPolicy())
			reqs := tt.reqs(t)
			var resp *musterv1.ReportJoinResponse
			var err error
			for _, r := range reqs {
				resp, err = e.client.ReportJoin(ctxT(t), r)
			}
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.msg)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetRecorded() != tt.wantRecorded {
				t.Errorf("recorded = %v, want %v", resp.GetRecorded(), tt.wantRecorded)
			}
			if n, _ := e.st.CountJoinReports(ctxT(t), a.id, time.Hour); n != 1 {
				t.Errorf("%d reports counted, want 1", n)
			}
		})
	}
}

// ticketClaims decodes a ticket with go-jose against the keys of a JWKS,
// the way any verifier of EdDSA JWTs would.
func ticketClaims(t *testing.T, jwks []byte, ticket string) (kid string, std jwt.Claims, priv map[string]any) {
	t.Helper()
	keys, err := referral.ParseJWKS(jwks)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.ParseSigned(ticket, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		t.Fatal(err)
	}
	kid = tok.Headers[0].KeyID
	key, ok := keys[kid]
	if !ok {
		t.Fatalf("ticket key %q is not in the JWKS %s", kid, jwks)
	}
	if err := tok.Claims(ed25519.PublicKey(key), &std, &priv); err != nil {
		t.Fatalf("ticket does not verify with key %s: %v", kid, err)
	}
	return kid, std, priv
}

func TestRequestReferralTicket(t *testing.T) {
	a := newAuthority(t, "prod")
	with := func(f func(p *discovery.Policy)) discovery.Policy {
		p := openPolicy()
		f(&p)
		return p
	}
	tests := []struct {
		name   string
		policy discovery.Policy
		// skip registering the authority
		unregistered bool
		authority    string // default a.id
		nodes        []string
		// code and reason are the outcome of the last request; the
		// others must succeed.
		code   codes.Code
		reason string
		// says, if set, is what the refusal's message says after its
		// reason.
		says string
	}{
		{name: "issued", policy: openPolicy(), nodes: []string{"web-1"}},
		// muster's rule for a node name, said as such: not an "invalid
		// SPIFFE ID" (the old words), which the agent never sent.
		{name: "malformed node ID", policy: openPolicy(), nodes: []string{"Web_1"}, code: codes.InvalidArgument, reason: discovery.DenyInvalid,
			says: `node ID "Web_1" is not a valid node name: it has the capital 'W': names are lower-case; node names are 1-63 of a-z 0-9 . -, starting and ending with a letter or digit`},
		{name: "malformed authority ID", policy: openPolicy(), authority: "x", nodes: []string{"web-1"}, code: codes.InvalidArgument, reason: discovery.DenyInvalid},
		{name: "unknown authority", policy: openPolicy(), unregistered: true, nodes: []string{"web-1"}, code: codes.NotFound, reason: discovery.DenyUnknown},
		{name: "source in the allowed CIDRs", nodes: []string{"web-1"},
			policy: with(func(p *discovery.Policy) { p.AllowedCIDRs = []string{"10.0.0.0/8", "127.0.0.0/8"} })},
		{name: "source outside the allowed CIDRs", nodes: []string{"web-1"}, code: codes.PermissionDenied, reason: discovery.DenySource,
			policy: with(func(p *discovery.Policy) { p.AllowedCIDRs = []string{"10.0.0.0/8"} })},
		{name: "node matches the pattern", nodes: []string{"web-1"},
			policy: with(func(p *discovery.Policy) { p.NodeIDPattern = `web-[0-9]+` })},
		{name: "node does not match the pattern", nodes: []string{"db-1"}, code: codes.PermissionDenied, reason: discovery.DenyNodeID,
			policy: with(func(p *discovery.Policy) { p.NodeIDPattern = `web-[0-9]+` })},
		{name: "node without an allowed prefix", nodes: []string{"db-1"}, code: codes.PermissionDenied, reason: discovery.DenyNodeID,
			policy: with(func(p *discovery.Policy) { p.NodeIDPrefixes = []string{"web-", "cache-"} })},
		{name: "node with an allowed prefix", nodes: []string{"cache-1"},
			policy: with(func(p *discovery.Policy) { p.NodeIDPrefixes = []string{"web-", "cache-"} })},
		{name: "node matching a denied pattern", nodes: []string{"web-admin"}, code: codes.PermissionDenied, reason: discovery.DenyNodeID,
			policy: with(func(p *discovery.Policy) { p.DeniedNodeIDPatterns = []string{`.*admin.*`} })},
		{name: "per node and source limit", nodes: []string{"web-1", "web-1", "web-1"}, code: codes.ResourceExhausted, reason: discovery.DenyRateLimit,
			policy: with(func(p *discovery.Policy) { p.RateLimits.PerNodeSource = discovery.Rate{PerMinute: 1, Burst: 2} })},
		{name: "per node and source limit is per node", nodes: []string{"web-1", "web-1", "web-2", "web-2"},
			policy: with(func(p *discovery.Policy) { p.RateLimits.PerNodeSource = discovery.Rate{PerMinute: 1, Burst: 2} })},
		{name: "per source limit", nodes: []string{"web-1", "web-2", "web-3"}, code: codes.ResourceExhausted, reason: discovery.DenyRateLimit,
			policy: with(func(p *discovery.Policy) { p.RateLimits.PerSource = discovery.Rate{PerMinute: 1, Burst: 2} })},
		{name: "per authority limit", nodes: []string{"web-1", "web-2", "web-3", "web-4"}, code: codes.ResourceExhausted, reason: discovery.DenyRateLimit,
			policy: with(func(p *discovery.Policy) { p.RateLimits.PerAuthority = discovery.Rate{PerMinute: 1, Burst: 3} })},
		{name: "tickets do not use the quota up", nodes: []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"},
			policy: with(func(p *discovery.Policy) { p.NewAgentsPerDay = 2 })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := start(t, generous)
			if !tt.unregistered {
				e.register(a, 1, tt.policy)
			}
			authority := tt.authority
			if authority == "" {
				authority = a.id
			}
			var resp *musterv1.RequestReferralTicketResponse
			var err error
			for i, node := range tt.nodes {
				resp, err = e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: authority, NodeId: node})
				if i < len(tt.nodes)-1 && err != nil {
					t.Fatalf("ticket %d for %s: %v", i, node, err)
				}
			}
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.reason+": "+tt.says)
				if got := counter(e.srv.metrics.denied.WithLabelValues(tt.reason)); got != 1 {
					t.Errorf("tickets_denied_total{reason=%q} = %v, want 1", tt.reason, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("RequestReferralTicket: %v", err)
			}
			if got := counter(e.srv.metrics.issued); got != float64(len(tt.nodes)) {
				t.Errorf("tickets_issued_total = %v, want %d", got, len(tt.nodes))
			}
			node := tt.nodes[len(tt.nodes)-1]
			// The authority's own check, against the served JWKS.
			claims, err := e.verifier(a).Verify(ctxT(t), resp.GetTicket(), node)
			if err != nil {
				t.Fatalf("the authority's verifier refuses the ticket: %v", err)
			}
			if claims.SourceIP != "127.0.0.1" || !claims.Expiry.Equal(resp.GetExpiresAt().AsTime()) {
				t.Errorf("claims %+v, expires_at %v", claims, resp.GetExpiresAt().AsTime())
			}
			// Any JOSE library, with the JWKS as published.
			kid, std, priv := ticketClaims(t, e.jwks(), resp.GetTicket())
			if id, _ := e.srv.keys.activeSince(); kid != id {
				t.Errorf("ticket signed by %s, want the active key %s", kid, id)
			}
			if std.Issuer != "https://"+e.addr || len(std.Audience) != 1 || std.Audience[0] != a.id || std.Subject != node ||
				priv["authority_id"] != a.id || priv["node_id"] != node || priv["source_ip"] != "127.0.0.1" || len(std.ID) != 32 {
				t.Errorf("claims %+v %v", std, priv)
			}
			if life := std.Expiry.Time().Sub(std.IssuedAt.Time()); life != referral.TTL {
				t.Errorf("ticket lifetime %v, want %v", life, referral.TTL)
			}
			if d := time.Until(std.Expiry.Time()); d < 50*time.Second || d > 61*time.Second {
				t.Errorf("ticket expires in %v, want about a minute", d)
			}
		})
	}
}

func TestRequestReferralTicketSourceLimit(t *testing.T) {
	e := start(t, func(s *Server) { s.sourceLimit = bucket{0.001, 3} })
	a := newAuthority(t, "prod")
	e.register(a, 1, openPolicy())
	var err error
	for range 4 {
		_, err = e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: "web-1"})
	}
	wantCode(t, err, codes.ResourceExhausted, "rate_limited: too many requests from 127.0.0.1")
	// Refused before the registration is read: unknown authorities are
	// refused alike, so the limit cannot be used to probe.
	_, err = e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: "nobody-abcdef", NodeId: "web-1"})
	wantCode(t, err, codes.ResourceExhausted, "rate_limited")
}

func TestQuotaCountsReportedJoins(t *testing.T) {
	e := start(t, generous)
	a := newAuthority(t, "prod")
	p := openPolicy()
	p.NewAgentsPerDay = 3
	e.register(a, 1, p)
	ask := func(node string) error {
		_, err := e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: node})
		return err
	}
	// Asking, however often, does not use the quota up.
	for i := range 20 {
		if err := ask("node-" + string(rune('a'+i))); err != nil {
			t.Fatalf("ticket %d: %v", i, err)
		}
	}
	report := func(instance string) bool {
		resp, err := e.client.ReportJoin(ctxT(t), a.report(t, "node-a", instance))
		if err != nil {
			t.Fatalf("ReportJoin %s: %v", instance, err)
		}
		return resp.GetRecorded()
	}
	if !report("inst-1") || !report("inst-2") {
		t.Fatal("a first report was not recorded")
	}
	// A replayed report counts once.
	for range 5 {
		if report("inst-2") {
			t.Fatal("a replayed report was recorded again")
		}
	}
	if err := ask("node-z"); err != nil {
		t.Fatalf("ticket with 2 of 3 joins reported: %v", err)
	}
	if !report("inst-3") {
		t.Fatal("third report not recorded")
	}
	wantCode(t, ask("node-z"), codes.ResourceExhausted, "quota_exhausted: ")
	// The refusal names the way out.
	wantCode(t, ask("node-z"), codes.ResourceExhausted, "raise discovery.policy.new_agents_per_day")
	if got := counter(e.srv.metrics.reports.WithLabelValues(resultRecorded)); got != 3 {
		t.Errorf("join_reports_total{recorded} = %v, want 3", got)
	}
	if got := counter(e.srv.metrics.reports.WithLabelValues(resultDuplicate)); got != 5 {
		t.Errorf("join_reports_total{duplicate} = %v, want 5", got)
	}
	// A new policy version without a quota takes effect at once.
	p.NewAgentsPerDay = 0
	e.register(a, 2, p)
	if err := ask("node-z"); err != nil {
		t.Errorf("ticket after the quota was lifted: %v", err)
	}
}

func TestRefusalsAreAudited(t *testing.T) {
	e := start(t, generous)
	a := newAuthority(t, "prod")
	p := openPolicy()
	p.AllowedCIDRs = []string{"10.0.0.0/8"}
	e.register(a, 1, p)
	for range 30 {
		_, err := e.client.RequestReferralTicket(ctxT(t), &musterv1.RequestReferralTicketRequest{AuthorityId: a.id, NodeId: "web-1"})
		wantCode(t, err, codes.PermissionDenied, "")
	}
	e.stop() // flushes the refusal window
	recs, err := e.st.ListAudit(context.Background(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var one, flood, registered int
	for _, r := range recs {
		switch r.Action {
		case "referral_ticket.issue":
			one++
			if r.Result != "denied" || r.Source != "127.0.0.1" || !strings.Contains(r.Reason, discovery.DenySource) || r.CorrelationID == "" {
				t.Errorf("refusal record %+v", r)
			}
		case "api.access.flood":
			flood++
			if !strings.HasPrefix(r.Reason, "10 further refusals") {
				t.Errorf("flood record %+v", r)
			}
		case "authority.register":
			registered++
			if !strings.Contains(r.Reason, "version 1") || !strings.Contains(r.Reason, a.h.Fingerprint()) {
				t.Errorf("registration record %+v", r)
			}
		}
	}
	if one != 20 || flood != 1 || registered != 1 {
		t.Errorf("%d refusals, %d flood records, %d registrations audited; want 20, 1, 1", one, flood, registered)
	}
}
