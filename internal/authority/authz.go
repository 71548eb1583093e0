package authority

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/callinfo"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// Caller is who made a request, as far as the TLS handshake proved it.
type Caller struct {
	// ID is zero for a caller without a client certificate, or with one
	// that did not verify.
	ID            spiffeid.ID
	Cert          *x509.Certificate
	Source        string
	CorrelationID string
	// Claimed is, for a caller refused because its certificate did not
	// verify, the identity that certificate names, marked as unproved
	// (claimedActor): for the audit record of the refusal only, so the
	// operator learns who tried. Nothing is granted on it.
	Claimed string
}

// Actor is how the caller appears in audit records.
func (c Caller) Actor() string {
	if c.ID.Role == "" {
		if c.Claimed != "" {
			return c.Claimed
		}
		return "anonymous"
	}
	return c.ID.String()
}

// Prefixes of the audit actor of a caller whose certificate did not
// verify, before the identity it names (claimedActor).
const (
	// actorExpired: a certificate this authority issued (it verifies as
	// of a moment it was valid), now expired or not yet valid.
	actorExpired = "expired:"
	// actorClaimed: a certificate whose signature is not this
	// authority's (or could not be checked): anyone can write a name in
	// one, so it is only what the caller claims.
	actorClaimed = "claimed:"
)

type callerKey struct{}

func callerFrom(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// access says what a service requires of its callers. Every service the
// authority serves must be listed: an unlisted one is refused, so a new
// service cannot be exposed by forgetting to write its rule.
type access int

const (
	accessPublic access = iota + 1
	accessAdmin
	// accessAgentOrAnonymous: a caller without a client certificate is
	// let through (the handler treats it as a bootstrap, proved by what it
	// sends); one with a certificate must pass the agent rule. The handler
	// checks the node's locks, with those of the instance, token and keys
	// it alone knows, in one query (enroll's renewal), so the rule here
	// does not look them up again.
	accessAgentOrAnonymous
	// accessAnonymous: only callers without a client certificate; one
	// with a certificate is refused (PERMISSION_DENIED).
	accessAnonymous
	// accessAgent: an agent certificate. The handlers check the
	// instance's standing (deletion, supersession, every lock) themselves
	// with enroll's Standing, the stream again while it lasts.
	accessAgent
)

var serviceAccess = map[string]access{
	"muster.v1.AdminService":       accessAdmin,
	"muster.v1.AgentService":       accessAgent,
	"muster.v1.BootstrapService":   accessPublic,
	"muster.v1.CertificateService": accessAgentOrAnonymous,
	// A bound-keypair refresh presents the agent certificate; a join or a
	// recovery presents none.
	"muster.v1.JoinService":                    accessAgentOrAnonymous,
	"grpc.health.v1.Health":                    accessPublic,
	"grpc.reflection.v1.ServerReflection":      accessPublic,
	"grpc.reflection.v1alpha.ServerReflection": accessPublic,
}

// bootstrapAccess overrides serviceAccess on the bootstrap-only listener,
// which serves the unauthenticated RPCs alone: there CertificateService
// takes PSK bootstraps only, and renewals go to the main listener.
var bootstrapAccess = map[string]access{
	"muster.v1.CertificateService": accessAnonymous,
}

// accessFor is the rule of service on the main or the bootstrap listener;
// zero (refused) for a service without one.
func accessFor(service string, bootstrapListener bool) access {
	if r, ok := bootstrapAccess[service]; ok && bootstrapListener {
		return r
	}
	return serviceAccess[service]
}

func serviceOf(fullMethod string) (service, method string) {
	s := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// authorize is the one place that reads a caller's role. It returns the
// caller for the handler, or a status error: UNAUTHENTICATED without a
// certificate, PERMISSION_DENIED with the wrong one or a locked identity.
func (s *Server) authorize(ctx context.Context, fullMethod string, bootstrapListener bool) (Caller, error) {
	c := Caller{CorrelationID: callinfo.CorrelationID(ctx)}
	if src := callinfo.Source(ctx); src.IsValid() {
		c.Source = src.String()
	}
	if p, ok := peer.FromContext(ctx); ok {
		if r, ok := p.AuthInfo.(refusedInfo); ok {
			// Counted and logged once, at its handshake (sharedCreds).
			return c, status.Error(codes.ResourceExhausted, r.reason)
		}
	}
	chain, err := s.clientChain(ctx)
	if err != nil {
		// Audited with who the certificate says it is (an operator whose
		// identity expired, say), marked unproved; c.ID stays zero.
		c.Claimed = s.claimedActor(ctx)
		return c, s.deny(ctx, c, fullMethod, codes.Unauthenticated, err.Error())
	}
	if chain != nil {
		c.Cert = chain[0]
		if id, err := spiffeid.FromCertificate(chain[0]); err == nil && id.TrustDomain == s.info.TrustDomain {
			c.ID = id
		}
	}
	service, _ := serviceOf(fullMethod)
	switch accessFor(service, bootstrapListener) {
	case accessPublic:
		return c, nil
	case accessAgentOrAnonymous:
		if chain == nil {
			return c, nil
		}
		return c, s.requireRole(ctx, c, chain, spiffeid.RoleAgent, ca.RoleAgent, "", fullMethod)
	case accessAnonymous:
		if chain == nil {
			return c, nil
		}
		return c, s.deny(ctx, c, fullMethod, codes.PermissionDenied,
			"this listener serves bootstraps only; renew at the authority's main address")
	case accessAdmin:
		return c, s.requireRole(ctx, c, chain, spiffeid.RoleAdmin, ca.RoleAdmin, store.LockAdmin, fullMethod)
	case accessAgent:
		return c, s.requireRole(ctx, c, chain, spiffeid.RoleAgent, ca.RoleAgent, "", fullMethod)
	default:
		return c, s.deny(ctx, c, fullMethod, codes.PermissionDenied, "no access rule for this service")
	}
}

// requireRole checks that the caller holds role, from the issuer's
// intermediate, and, unless lockKind is empty, that no lock of that kind
// is on its name.
func (s *Server) requireRole(ctx context.Context, c Caller, chain []*x509.Certificate, role spiffeid.Role, issuer ca.Role, lockKind, fullMethod string) error {
	var reason string
	var code codes.Code
	switch {
	case chain == nil:
		code, reason = codes.Unauthenticated, "no client certificate; "+roleWayOut(role)
	case len(chain) < 2 || !issuedBy(chain[1], s.ca.Accepted(issuer)):
		code, reason = codes.PermissionDenied, fmt.Sprintf("certificate not issued by the %s intermediate; %s", issuer, roleWayOut(role))
	case c.ID.Role != role:
		code, reason = codes.PermissionDenied, fmt.Sprintf("certificate does not carry a spiffe://%s/%s/ identity; %s", s.info.TrustDomain, role, roleWayOut(role))
	case lockKind == "":
		return nil
	default:
		// Only admin calls name a lock kind: the operator's serial and
		// the lock on its name are read together.
		serial := chain[0].SerialNumber.Text(16)
		st, err := s.store.ReadOperatorStanding(ctx, serial, c.ID.Name)
		switch {
		case err == nil:
		case s.outage.fail(err):
			return storeUnavailable()
		default:
			s.log.Error("operator lookup failed", "err", err, "correlation_id", c.CorrelationID)
			return status.Error(codes.Unavailable, "cannot check the operator identity")
		}
		if st.Locked {
			// The caller is told DESIGN.md's word; the audit record
			// names the lock and how it is lifted.
			return s.denyWith(ctx, c, fullMethod, codes.PermissionDenied, enroll.ReasonLocked,
				fmt.Sprintf("locked: lock %s on %s %s; another operator lifts it with muster lock delete %s", st.Lock.ID, st.Lock.Kind, st.Lock.Target, st.Lock.ID))
		}
		if !st.Known {
			// Signed by an intermediate this authority holds, yet not
			// recorded: the store was restored from a backup taken
			// before it was issued. It is refused as an agent's is
			// (certificate_unknown): muster admin list does not show
			// it, and a lock could not be told which certificate to
			// name. The operator acts on it, so it is told the way out.
			return s.denyUnknown(ctx, c, fullMethod, unknownOperatorReason(serial, c.ID.Name, s.breakGlassBin(), s.breakGlassData()))
		}
		return nil
	}
	return s.deny(ctx, c, fullMethod, code, reason)
}

// unknownOperatorReason is the refusal of an operator identity the
// store holds no record of, naming the ways back: another operator's
// muster admin add, or the break-glass one beside the storage key, run
// with bin (breakGlassBin). Both name an --out of their own, since the
// default NAME.pem is often the refused file, which admin add never
// overwrites.
func unknownOperatorReason(serial, name, bin, data string) string {
	return fmt.Sprintf("%s: operator identity serial %s (%s) is not in this authority's store, which was restored from a backup taken before it was issued; "+
		"get a new identity from another operator with muster admin add %s --reissue --out %s-new.pem, or, if no operator's identity works, with %s admin add %s --offline --data %s --out %s-new.pem, run where the authority's data directory (its storage key) is (docs/high-availability.md, \"Backup and restore\")",
		enroll.ReasonCertificateUnknown, serial, name, name, name, bin, name, data, name)
}

// breakGlassBin is the binary whose admin add --offline opens this
// authority's keys: muster-pkcs11 where they are in a PKCS#11 token,
// which the static muster refuses to open (a packaged install has both),
// muster where they are sealed.
func (s *Server) breakGlassBin() string {
	if s.token != nil {
		return "muster-pkcs11"
	}
	return "muster"
}

// breakGlassData is the break-glass command's --data value (and
// --config, where this authority was started with a settings file not in
// its directory, as the packaged unit is): this authority's own, quoted,
// so that the command runs pasted on its machine; DIR for a server that
// knows none (a test's).
func (s *Server) breakGlassData() string {
	if s.cfg.Dir == "" {
		return "DIR"
	}
	return shellword.Quote(string(s.cfg.Dir)) + s.cfg.Dir.ConfigArg(s.cfg.ConfigFile)
}

// onlineData is the --data value of a command that calls this running
// authority (not --offline): its directory, quoted, without --config,
// which such commands refuse; DIR for a server that knows none.
func (s *Server) onlineData() string {
	if s.cfg.Dir == "" {
		return "DIR"
	}
	return shellword.Quote(string(s.cfg.Dir))
}

// denyUnknown audits the refusal of an unrecorded operator identity and
// returns it with the reason word an agent's gets (certificate_unknown),
// the message telling the way out.
func (s *Server) denyUnknown(ctx context.Context, c Caller, fullMethod, reason string) error {
	s.refusals.Record(ctx, audit.Event{
		Actor: c.Actor(), Action: "api.access", Target: fullMethod, Result: audit.ResultDenied,
		Reason: reason, Source: c.Source, CorrelationID: c.CorrelationID,
	})
	return errinfo.Error(codes.PermissionDenied, reason, refusalWords[enroll.ReasonCertificateUnknown])
}

// issuedBy reports whether c is byte for byte one of the accepted
// intermediates: the active one of its role or one the trust bundle still
// carries (prepared or retiring).
func issuedBy(c *x509.Certificate, accepted []*x509.Certificate) bool {
	for _, a := range accepted {
		if bytes.Equal(c.Raw, a.Raw) {
			return true
		}
	}
	return false
}

// roleWayOut says which identity the calls of role need, and where it
// comes from: the way out of a refusal for the wrong (or no) certificate.
func roleWayOut(role spiffeid.Role) string {
	if role == spiffeid.RoleAdmin {
		return "admin calls need an operator identity (--identity FILE or MUSTER_IDENTITY), which muster admin add NAME makes"
	}
	return "agent calls need the certificate of an agent that joined this authority (muster agent join)"
}

// deny audits a refused call and returns its status.
func (s *Server) deny(ctx context.Context, c Caller, fullMethod string, code codes.Code, reason string) error {
	return s.denyWith(ctx, c, fullMethod, code, reason, reason)
}

// denyWith is deny when the audit record says more than the caller is
// told (which lock refused it).
func (s *Server) denyWith(ctx context.Context, c Caller, fullMethod string, code codes.Code, reason, auditReason string) error {
	s.refusals.Record(ctx, audit.Event{
		Actor:         c.Actor(),
		Action:        "api.access",
		Target:        fullMethod,
		Result:        audit.ResultDenied,
		Reason:        auditReason,
		Source:        c.Source,
		CorrelationID: c.CorrelationID,
	})
	return refused(code, reason)
}

// standing checks that the calling agent may still be served (its
// certificate known, its instance current, no lock on it) for the agent
// RPCs that do not go through enroll, which audits its own refusals: a
// refusal is audited like any refused call, through the flood guard,
// since a locked agent may keep asking.
func (a *agentService) standing(ctx context.Context) error {
	c := callerFrom(ctx)
	err := a.s.enroll.Standing(ctx, c.Cert)
	if ref := (*enroll.Refusal)(nil); errors.As(err, &ref) {
		method, _ := grpc.Method(ctx)
		a.s.refusals.Record(ctx, audit.Event{Actor: c.Actor(), Action: "api.access", Target: method,
			Result: audit.ResultDenied, Reason: ref.AuditText(), Source: c.Source, CorrelationID: c.CorrelationID})
	}
	return toStatus(ctx, a.s.log, err)
}

// badRequest refuses an agent's malformed request (INVALID_ARGUMENT) and
// audits it like any refused call, through the flood guard.
func (a *agentService) badRequest(ctx context.Context, msg string) error {
	method, _ := grpc.Method(ctx)
	return a.s.deny(ctx, callerFrom(ctx), method, codes.InvalidArgument, msg)
}

// clientChain verifies the client certificate the caller gave, if any,
// as a TLS server would (to this authority's root, for client use, now),
// presented whole or as the leaf alone (clientAnchors), and returns its
// verified chain, leaf first and its intermediate second
// (the root follows only when the full check ran: the short path of
// clientAnchors stops at the intermediate it trusts): nil without a
// certificate, an error whose text says what is wrong with one that does
// not verify.
func (s *Server) clientChain(ctx context.Context) ([]*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, nil
	}
	var ti credentials.TLSInfo
	var cc *connChain
	switch info := p.AuthInfo.(type) {
	case *connAuthInfo:
		// The check is kept per connection while what it was made
		// against holds (connchain.go).
		ti, cc = info.TLSInfo, info.chain
	case credentials.TLSInfo:
		ti = info
	default:
		return nil, nil
	}
	if len(ti.State.PeerCertificates) == 0 {
		return nil, nil
	}
	// The replica's clock, which also dates the trust bundle and the
	// rotations whose intermediates the chain is checked against (the TLS
	// stack verifies nothing here: it only requests the certificate).
	return s.verifyConnCerts(cc, ti.State.PeerCertificates, s.now())
}

// claimedActor is the audit actor of a caller whose client certificate
// did not verify: the agent or operator identity of this trust domain it
// names, after actorExpired when it is one this authority issued (signed
// by an accepted intermediate of that role: its refusal is then its
// validity period) and actorClaimed otherwise; "" when it names none.
func (s *Server) claimedActor(ctx context.Context) string {
	certs := peerCertificates(ctx)
	if len(certs) == 0 {
		return ""
	}
	leaf := certs[0]
	id, err := spiffeid.FromCertificate(leaf)
	if err != nil || id.TrustDomain != s.info.TrustDomain {
		return ""
	}
	issuer, ok := issuerRole(id.Role)
	if !ok {
		return ""
	}
	if now := s.now(); !now.After(leaf.NotAfter) && !now.Before(leaf.NotBefore) {
		// Refused for another reason than its validity period.
		return actorClaimed + id.String()
	}
	for _, in := range s.ca.Accepted(issuer) {
		if bytes.Equal(leaf.AuthorityKeyId, in.SubjectKeyId) && leaf.CheckSignatureFrom(in) == nil {
			return actorExpired + id.String()
		}
	}
	return actorClaimed + id.String()
}

// issuerRole is the role of the intermediates that issue certificates
// of an identity's role: admin and agent identities only (the authority's
// own is not issued by an intermediate).
func issuerRole(r spiffeid.Role) (ca.Role, bool) {
	switch r {
	case spiffeid.RoleAdmin:
		return ca.RoleAdmin, true
	case spiffeid.RoleAgent:
		return ca.RoleAgent, true
	}
	return "", false
}

// peerCertificates is what the caller presented in its TLS handshake,
// leaf first, unverified; nil without a certificate.
func peerCertificates(ctx context.Context) []*x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	switch info := p.AuthInfo.(type) {
	case *connAuthInfo:
		return info.TLSInfo.State.PeerCertificates
	case credentials.TLSInfo:
		return info.State.PeerCertificates
	}
	return nil
}

// verifyClientCertsAt is clientChain's check of the certificates a client
// presented (at least one), at now.
func (s *Server) verifyClientCertsAt(certs []*x509.Certificate, now time.Time) ([]*x509.Certificate, error) {
	if chain, ok := s.anchors.verify(s.ca, certs, now); ok {
		return chain, nil
	}
	chains, err := certs[0].Verify(x509.VerifyOptions{
		Roots: s.ca.RootPool(), Intermediates: s.anchors.intermediates(s.ca, certs), CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	var invalid x509.CertificateInvalidError
	var unknown x509.UnknownAuthorityError
	switch {
	case err == nil:
		return chains[0], nil
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return nil, errors.New(expiredReason(certs[0], s.info.TrustDomain, s.breakGlassBin(), s.breakGlassData()))
	case errors.As(err, &unknown):
		if why := s.distrustedReason(certs[0]); why != "" {
			return nil, errors.New(why)
		}
		if why := s.unheldIssuerReason(certs); why != "" {
			return nil, errors.New(why)
		}
		return nil, errors.New("client certificate not issued by this authority (or by a root it no longer trusts)" + foreignWayOut)
	default:
		return nil, errors.New("client certificate not valid for client authentication by this authority" + foreignWayOut)
	}
}

// unheldIssuerReason is the refusal of leaf, an agent's or operator's
// certificate of this trust domain, whose issuer bears the name of this
// authority's intermediates of its role but is none it holds: an
// intermediate prepared after the backup the store was restored from (every
// agent that renewed under it since is refused so at once, not as
// certificate_unknown), or one retired. It names the way out with the
// leaf's own node, as certificate_unknown does (the agent fills in its
// directory for ADIR); "" for any other leaf. Only a leaf presented alone,
// as an agent presents it to a listener naming its issuer's name among
// the acceptable ones: an intermediate presented with it did not verify
// under this authority's root, so it is another's. Refused either way: the
// name, not a signature, picks the message.
func (s *Server) unheldIssuerReason(certs []*x509.Certificate) string {
	if len(certs) != 1 {
		return ""
	}
	leaf := certs[0]
	id, err := spiffeid.FromCertificate(leaf)
	if err != nil || id.TrustDomain != s.info.TrustDomain {
		return ""
	}
	role, ok := issuerRole(id.Role)
	if !ok {
		return ""
	}
	named := false
	for _, in := range s.ca.Accepted(role) {
		if bytes.Equal(leaf.AuthorityKeyId, in.SubjectKeyId) {
			return ""
		}
		named = named || bytes.Equal(leaf.RawIssuer, in.RawSubject)
	}
	if !named {
		return ""
	}
	const why = unheldIssuerRefusal + "its issuer, named as this authority's " +
		"%s intermediate, is none the authority holds (its store was restored from a backup taken before that intermediate " +
		"was prepared, or the intermediate was retired)"
	if id.Role == spiffeid.RoleAdmin {
		return fmt.Sprintf(why+"; get a new identity with %s admin add %s --offline --data %s, run where the authority's data directory (its storage key) is (%s)", role, s.breakGlassBin(), id.Name, s.breakGlassData(), s.restoreSection())
	}
	return fmt.Sprintf(why+"; join again over this identity: muster agent join --force --data ADIR --node %s with a joining URI from muster token create --node %s (%s)", role, id.Name, id.Name, s.restoreSection())
}

// restoreSection names the docs section on restoring the store in use:
// the operator guide's for SQLite, high-availability's for PostgreSQL
// (replicated), whose pg_restore an operator on SQLite has no use for.
// A server without a store (a test's) is taken as on SQLite.
func (s *Server) restoreSection() string {
	if s.store != nil && s.store.Replicated() {
		return `docs/high-availability.md, "Backup and restore"`
	}
	return `docs/operator-guide.md, "Backing up and restoring the SQLite store"`
}

// unheldIssuerRefusal begins unheldIssuerReason's refusals, which carry
// the reason issuer_unknown (refusalReason): the agent renews at once on
// it, and stops with the way out.
const unheldIssuerRefusal = "client certificate not issued by this authority's intermediates: "

// foreignWayOut ends the refusal of a certificate this authority does not
// accept: the caller holds another authority's identity (or one from a
// root this one no longer trusts).
const foreignWayOut = "; an agent must join this authority again (muster agent join), an operator needs an identity from it (muster admin add NAME)"

// interceptors are the authorization interceptors of one listener.
func (s *Server) interceptors(bootstrapListener bool) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			return s.unaryAuth(ctx, req, info, handler, bootstrapListener)
		}, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			return s.streamAuth(srv, ss, info, handler, bootstrapListener)
		}
}

func (s *Server) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler, bootstrapListener bool) (_ any, err error) {
	// A panic here or in the handler is the call's INTERNAL answer, logged
	// with the caller once it is known (recover.go).
	defer func() {
		if r := recover(); r != nil {
			err = s.panicAnswer(ctx, info.FullMethod, r)
		}
	}()
	c, err := s.authorize(ctx, info.FullMethod, bootstrapListener)
	if err != nil {
		return nil, err
	}
	if unparsedRequest(ctx) {
		return nil, s.deny(ctx, c, info.FullMethod, codes.InvalidArgument, badMessage)
	}
	grpc.SetHeader(ctx, metadata.Pairs(callinfo.CorrelationHeader, c.CorrelationID))
	ctx = context.WithValue(ctx, callerKey{}, c)
	return handler(ctx, req)
}

type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w wrappedStream) Context() context.Context { return w.ctx }

func (s *Server) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler, bootstrapListener bool) error {
	// authorize verifies the client's chain: done apart, so a long-lived
	// agent stream does not keep the stack that grew (stack.go).
	// A panic is answered here for the authorization, which runs apart,
	// and by the handler for the rest (agentService.Connect): a deferred
	// recovery in this frame would lie under every held stream's wait and
	// take its stack past the 4 KiB it fits in (stack.go).
	var (
		c   Caller
		err error
	)
	apart(func() {
		defer s.recovered(ss.Context(), info.FullMethod, &err)
		c, err = s.authorize(ss.Context(), info.FullMethod, bootstrapListener)
	})
	if err != nil {
		return err
	}
	ss.SetHeader(metadata.Pairs(callinfo.CorrelationHeader, c.CorrelationID))
	return handler(srv, wrappedStream{ss, context.WithValue(ss.Context(), callerKey{}, c)})
}

// distrustedCaller is the refusal of leaf, the certificate an open
// agent stream was authorized with, once the trust it verified under has
// changed so that it no longer verifies (distrustedReason's refusal, or
// the generic one); "" while it verifies, and for an expired leaf, whose
// stream its own deadline ends. Both by the replica's clock (s.now), the
// one its trust bundle is made by.
func (s *Server) distrustedCaller(leaf *x509.Certificate) string {
	now := s.now()
	if leaf == nil || !now.Before(leaf.NotAfter) {
		return ""
	}
	if _, err := s.verifyClientCertsAt([]*x509.Certificate{leaf}, now); err != nil {
		return err.Error()
	}
	return ""
}

// distrustedReason is the refusal of a leaf signed by an intermediate of
// a root this authority no longer trusts, naming the way back; "" for any
// other leaf. That root is the old one of a rotation in standby (the leaf
// was not renewed under the new root in update_servers), which a rollback
// to update_servers trusts again, or one a rotation left behind for good
// (a new root abandoned by a rollback from init to none before the leaf
// was renewed under the old one, or the old root of an earlier rotation),
// which only a new join or identity replaces. A running agent meets it at
// its next renewal and stops: restarting cannot help.
func (s *Server) distrustedReason(leaf *x509.Certificate) string {
	in := s.ca.CurrentIntermediates()
	if in == nil {
		return ""
	}
	for _, c := range in.Distrusted {
		if !bytes.Equal(leaf.AuthorityKeyId, c.SubjectKeyId) || leaf.CheckSignatureFrom(c) != nil {
			continue
		}
		id, err := spiffeid.FromCertificate(leaf)
		if err != nil || id.TrustDomain != s.info.TrustDomain {
			return ""
		}
		const why = "client certificate not issued by this authority: it is under a root this authority no longer trusts"
		if s.rollbackTrusts(c) {
			const when = why + " (the root rotation went to standby before it was renewed under the new root)"
			if id.Role == spiffeid.RoleAdmin {
				return fmt.Sprintf("%s; get a new identity with %s admin add %s --offline --data %s, run where the authority's data directory (its storage key) is, or roll back to update_servers with muster ca root rollback", when, s.breakGlassBin(), id.Name, s.breakGlassData())
			}
			return fmt.Sprintf("%s; join again over this identity: muster agent join --force --data ADIR --node %s with a joining URI from muster token create --node %s, or an operator rolls back to update_servers with muster ca root rollback and the agent, started again, renews", when, id.Name, id.Name)
		}
		const when = why + " (a root rotation left it behind before this certificate was renewed under the root trusted now: a rollback from init abandoned the new root, or a rotation finished earlier retired the old one); no rollback brings it back"
		if id.Role == spiffeid.RoleAdmin {
			return fmt.Sprintf("%s; get a new identity with %s admin add %s --offline --data %s, run where the authority's data directory (its storage key) is", when, s.breakGlassBin(), id.Name, s.breakGlassData())
		}
		return fmt.Sprintf("%s; join again over this identity: muster agent join --force --data ADIR --node %s with a joining URI from muster token create --node %s", when, id.Name, id.Name)
	}
	return ""
}

// rollbackTrusts reports whether a rollback would trust again the root
// that signed the intermediate in: the old root of a rotation in standby
// (read with the intermediates: standby's cross-certificates no longer
// carry the old root's key).
func (s *Server) rollbackTrusts(in *x509.Certificate) bool {
	cur := s.ca.CurrentIntermediates()
	if cur == nil {
		return false
	}
	for _, c := range cur.Restorable {
		if bytes.Equal(c.Raw, in.Raw) {
			return true
		}
	}
	return false
}

// expiredReason is the refusal of an expired (or not yet valid) client
// certificate, naming what brings its holder back: an agent joins again;
// an operator cannot renew, so another operator issues it a new identity
// (the name's only one has expired: no --reissue), or, when none is left,
// the break-glass command run beside the storage key, with bin
// (breakGlassBin). Both name an --out of their own: the default NAME.pem
// is often the expired file itself, which admin add never overwrites.
func expiredReason(leaf *x509.Certificate, trustDomain, bin, data string) string {
	if id, err := spiffeid.FromCertificate(leaf); err == nil && id.TrustDomain == trustDomain && id.Role == spiffeid.RoleAdmin {
		return fmt.Sprintf("client certificate expired or not yet valid; an operator whose identity expired gets a new one from another operator with muster admin add %s --out %s-new.pem, or, if no operator's identity works, with %s admin add %s --offline --data %s --out %s-new.pem, run where the authority's data directory (its storage key) is", id.Name, id.Name, bin, id.Name, data, id.Name)
	}
	if id, err := spiffeid.FromCertificate(leaf); err == nil && id.TrustDomain == trustDomain && id.Role == spiffeid.RoleAgent {
		// A bound-keypair agent is told too: it does not join again, it
		// recovers by itself (and its stream is refused this way until it
		// has).
		return fmt.Sprintf("client certificate expired or not yet valid; an agent whose certificate expired must join again: muster agent join --force --data ADIR --node %s with a joining URI from muster token create --node %s (a bound-keypair agent recovers with its bound key instead: muster agent run does it)", id.Name, id.Name)
	}
	return "client certificate expired or not yet valid; an agent whose certificate expired must join again"
}
