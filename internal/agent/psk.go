package agent

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// Errors of the check an agent makes before it sends the PSK; either way
// the PSK was not sent.
var (
	// ErrPinnedRoot: the server's chain does not end at the root of the
	// CA fingerprint.
	ErrPinnedRoot = errors.New("the authority's certificate chain does not end at the root of the CA fingerprint")
	// ErrNotAuthority: the chain ends at the pinned root, but the server
	// does not prove to be the authority (no valid chain to it, or no
	// spiffe://TD/authority/ID SAN, or another authority ID).
	ErrNotAuthority = errors.New("the server is not an authority under the pinned root")
)

// authorityPeer is who a TLS handshake proved the server to be.
type authorityPeer struct {
	id   spiffeid.ID
	root *x509.Certificate
	// roots is root and every root the server presented with a
	// cross-certificate under it (a root rotation's other root): the
	// certificate the join returns may chain to either.
	roots []*x509.Certificate
}

// verifyAuthority checks a server's chain without a trust bundle: the last
// certificate must be a root with the pinned key, the chain must verify to
// it for server authentication, and the leaf must carry
// spiffe://TD/authority/ID (with ID = authorityID when that is given).
func verifyAuthority(certs []*x509.Certificate, fingerprint, authorityID string, now time.Time) (*authorityPeer, error) {
	if len(certs) < 2 {
		return nil, fmt.Errorf("%w: the authority sent no root", ErrPinnedRoot)
	}
	// The pinned root may be any certificate after the leaf: during a root
	// rotation the authority presents both roots and the cross-certificate
	// between them, its signing root last (DESIGN.md "Root rotation").
	var root *x509.Certificate
	for _, c := range certs[1:] {
		if ca.MatchesFingerprint(c, fingerprint) && identity.IsRoot(c) {
			root = c
			break
		}
	}
	if root == nil {
		last := certs[len(certs)-1]
		return nil, fmt.Errorf("%w %s (its last certificate has %s)", ErrPinnedRoot, fingerprint, ca.Fingerprint(last))
	}
	pool := x509.NewCertPool()
	pool.AddCert(root)
	var got spiffeid.ID
	match := func(id spiffeid.ID) error {
		if id.Role != spiffeid.RoleAuthority {
			return fmt.Errorf("the server is %s, not an authority", id)
		}
		if authorityID != "" && id.Name != authorityID {
			return fmt.Errorf("the server is authority %s, want %s", id.Name, authorityID)
		}
		got = id
		return nil
	}
	if err := identity.VerifyPeer(certs, pool, match, x509.ExtKeyUsageServerAuth, now); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotAuthority, err)
	}
	return &authorityPeer{id: got, root: root, roots: append([]*x509.Certificate{root}, identity.CrossCertified(certs, pool, now)...)}, nil
}

// probeAuthority makes one TLS handshake with the authority and verifies it
// by the pinned root alone, before anything is sent. A failure to connect
// is a network error (transient); a server that fails the check is a
// permanent error.
func (a *Agent) probeAuthority(ctx context.Context, r JoinRequest) (*authorityPeer, error) {
	var peer *authorityPeer
	var verr error
	tc := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Verified in VerifyConnection, by the pinned root and the SPIFFE
		// ID; host names are not how muster identifies an authority.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			peer, verr = verifyAuthority(cs.PeerCertificates, r.CAFingerprint, r.AuthorityID, a.now())
			return verr
		},
		NextProtos: []string{"h2"},
	}
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	d := tls.Dialer{Config: tc}
	conn, err := d.DialContext(cctx, "tcp", r.Authority)
	if verr != nil {
		nothing := "the PSK was not sent"
		if r.method() == JoinMethodBoundKeypair {
			nothing = "no challenge was signed"
		}
		if errors.Is(verr, ErrPinnedRoot) {
			return nil, fmt.Errorf("%w (the authority at %s; %s); %s", verr, r.Authority, nothing, pinnedRootHint)
		}
		return nil, fmt.Errorf("%w (the authority at %s; %s)", verr, r.Authority, nothing)
	}
	if err != nil {
		return nil, err
	}
	conn.Close()
	return peer, nil
}

// joinPSK joins with the bootstrap PSK: it verifies the authority by the
// pinned root before the PSK leaves the machine, then asks for a
// certificate for a CSR whose common name is the node ID. Through
// discovery, it first looks the authority up and, once an endpoint has
// proved to be that authority, asks discovery for a referral ticket; a
// ticket refused for its key is followed by fresh ones (freshTickets).
func (a *Agent) joinPSK(ctx context.Context, r JoinRequest, key crypto.Signer) (*joinResult, error) {
	if r.Discovery == "" {
		peer, err := a.probeAuthority(ctx, r)
		if err != nil {
			return nil, err
		}
		return a.requestPSK(ctx, r, peer, "", key)
	}
	return freshTickets(ctx, a.log, r, a.rejoinCommand(r), func() (*joinResult, error) {
		endpoint, peer, ticket, err := a.refer(ctx, r)
		if err != nil {
			return nil, err
		}
		at := r
		at.Authority = endpoint
		return a.requestPSK(ctx, at, peer, ticket, key)
	})
}

// requestPSK sends the CSR, the PSK and the ticket to r.Authority over a
// connection that checks the root and the exact authority ID the probe
// found in peer: nothing goes to a server that has not proved to be it.
func (a *Agent) requestPSK(ctx context.Context, r JoinRequest, peer *authorityPeer, ticket string, key crypto.Signer) (*joinResult, error) {
	agentID, err := spiffeid.New(peer.id.TrustDomain, spiffeid.RoleAgent, r.Node)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, r := range peer.roots {
		pool.AddCert(r)
	}
	conn, err := dial(r.Authority, identity.ClientTLS(nil, pool, identity.MatchID(peer.id)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: r.Node}}, key)
	if err != nil {
		return nil, err
	}
	req := &musterv1.RequestCertificateRequest{Csr: csr, ReferralTicket: ticket}
	if !r.PSK.IsZero() {
		req.BootstrapPsk = r.PSK.Reveal()
	}
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(cctx, req)
	if err != nil {
		return nil, pskRefusalHint(err, r.Node)
	}
	roots := peer.roots
	chain, err := verifyIssued(resp.GetCertificateChainPem(), key, roots, agentID, a.now())
	if err != nil {
		return nil, err
	}
	return &joinResult{chain: chain, roots: roots, authorityID: peer.id.Name, trustDomain: peer.id.TrustDomain,
		instanceID: resp.GetInstanceId(), generation: resp.GetGeneration(),
		renewal: renewalAddress(resp.GetEndpoints(), r.Authority), joined: r.Authority, verifierSet: resp.GetVerifierSet(),
		bundle: resp.GetTrustBundle()}, nil
}

// A ticket refused for its key is one discovery signed with a key it
// stopped publishing seconds later (muster discovery rotate-key
// --revoke-previous: a replica signs with the revoked key until it
// reloads its keys, within 5 s), or with one the authority had not
// fetched yet. A fresh ticket is signed with the key discovery signs
// with now, so the join asks for one, ticketAttempts times in all,
// waiting ticketWait, doubled each time, in between: 2+4+8 s cover the
// reload and the authority's least time between two fetches (10 s).
// Past that, discovery keeps signing with keys the authority does not
// get, which no retry cures.
const ticketAttempts = 4

// ticketWait is the first wait between the attempts; tests shorten it.
var ticketWait = 2 * time.Second

// ticketKeyRefused reports whether err refuses a ticket for its key.
func ticketKeyRefused(err error) bool {
	switch errinfo.Reason(err) {
	case "ticket_key_unknown", "ticket_key_not_fetched":
		return true
	}
	return false
}

// freshTickets runs join (a look-up, a new ticket, and the request) until
// it succeeds, fails otherwise, or was refused for the ticket's key
// ticketAttempts times; the last refusal then names the way out, ending
// with rejoin, the command that joins again. Each attempt probes the
// authority again before the PSK is sent, and each retry is logged once,
// with the refusal's reason.
func freshTickets(ctx context.Context, log *slog.Logger, r JoinRequest, rejoin string, join func() (*joinResult, error)) (*joinResult, error) {
	wait := ticketWait
	for attempt := 1; ; attempt++ {
		j, err := join()
		if err == nil || !ticketKeyRefused(err) {
			return j, err
		}
		if attempt == ticketAttempts {
			return nil, withHint(err, fmt.Sprintf("%d tickets from discovery %s in a row were refused for their key: discovery signs with keys the authority does not fetch "+
				"(replicas on separate stores, or an authority whose discovery.address names another discovery): "+
				"compare the key IDs discovery publishes at https://%s/.well-known/jwks.json (muster discovery show --data DIR on each discovery replica lists its keys) "+
				"with the one the authority refused (muster audit list --action agent.join on the authority), "+
				"give every discovery replica the same store (--store) and name it by the same address on the authority (discovery.address), "+
				"then join again, with a fresh ticket: %s", ticketAttempts, r.Discovery, r.Discovery, rejoin))
		}
		if log != nil {
			log.Warn("the authority refused the referral ticket for its key (discovery's key rotated or revoked); asking discovery for a new one",
				"reason", errinfo.Reason(err), "discovery", r.Discovery, "attempt", attempt, "of", ticketAttempts, "retry_in", wait.String(), "err", status.Convert(err).Message())
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, &ticketWaitEnded{discovery: r.Discovery, attempt: attempt, wait: wait, end: ctx.Err(), last: err}
		case <-t.C:
		}
		wait *= 2
	}
}

// rejoinCommand is the muster agent join that joins again as r did,
// through discovery; the PSK is named by a file, as it is never printed.
func (a *Agent) rejoinCommand(r JoinRequest) string {
	cmd := fmt.Sprintf("muster agent join --data %s --node %s --discovery %s --authority-id %s --ca-fingerprint %s",
		shellword.Quote(string(a.dir)), shellword.Quote(r.Node), shellword.Quote(r.Discovery), shellword.Quote(r.AuthorityID), shellword.Quote(r.CAFingerprint))
	if r.DiscoveryFingerprint != "" {
		cmd += " --discovery-fingerprint " + shellword.Quote(r.DiscoveryFingerprint)
	}
	if r.Force {
		cmd += " --force"
	}
	return cmd + " --psk-file F (F holding the PSK; leave --psk-file out when MUSTER_BOOTSTRAP_PSK or the agent.yaml of --data gives it)"
}

// ticketWaitEnded is a join through discovery whose context ended (the
// agent stopped, or the caller's deadline passed) while it waited to ask
// for a fresh ticket after a refusal for the ticket's key. It says which
// ended the wait, and carries the last refusal as its cause: its gRPC
// code and reason are the refusal's, so what classes the join's failure
// by them (agent run's retry, errinfo.Reason) sees the same as before.
type ticketWaitEnded struct {
	discovery string
	attempt   int           // the attempts made, each refused for its key
	wait      time.Duration // the wait the context cut short
	end       error         // ctx.Err(): context.Canceled or DeadlineExceeded
	last      error         // the last refusal
}

func (e *ticketWaitEnded) say() string {
	what := "the join was stopped"
	if errors.Is(e.end, context.DeadlineExceeded) {
		what = "the join's deadline passed"
	}
	return fmt.Sprintf("%s while it waited to ask discovery %s for a fresh referral ticket (%d of %d refused for their key, the next due in %s); the last refusal",
		what, e.discovery, e.attempt, ticketAttempts, e.wait)
}

func (e *ticketWaitEnded) Error() string   { return e.say() + ": " + e.last.Error() }
func (e *ticketWaitEnded) Unwrap() []error { return []error{e.end, e.last} }

// GRPCStatus is the last refusal's status, its message prefixed with
// what ended the wait (what prints a failure prints a status's message).
func (e *ticketWaitEnded) GRPCStatus() *status.Status {
	s, ok := status.FromError(e.last)
	if !ok {
		return status.New(codes.Unknown, e.Error())
	}
	p := s.Proto()
	p.Message = e.say() + ": " + p.Message
	return status.FromProto(p)
}

// DiscoveryError is a call to discovery that failed (a refusal, or
// discovery unreachable), so that what prints it names discovery: the
// gRPC status inside says nothing of which server answered, and an
// UNAVAILABLE is not the authority's.
type DiscoveryError struct {
	Addr string // discovery's address
	Step string // what was asked: "looking up ID", "referral ticket"
	Err  error
}

func (e *DiscoveryError) Error() string {
	return "discovery " + e.Addr + ": " + e.Step + ": " + e.Err.Error()
}
func (e *DiscoveryError) Unwrap() error { return e.Err }

// discoveryError is the failure of a call to discovery at step. A TLS
// identity that does not match the pinned fingerprint is a configuration
// error, PERMISSION_DENIED (gRPC calls it UNAVAILABLE, which agent run
// would retry forever): discovery's CA does not rotate (it lives as long
// as discovery's data directory), so only a corrected pin ends it.
func discoveryError(r JoinRequest, step string, err error) error {
	if msg, ok := discoveryclient.PinMismatch(err); ok {
		err = &refusal{codes.PermissionDenied, errors.New(msg)}
	}
	return &DiscoveryError{Addr: r.Discovery, Step: step, Err: err}
}

// refer goes through discovery: it locates the authority, and only then
// asks discovery for a referral ticket for the node. Nothing secret goes
// to discovery.
func (a *Agent) refer(ctx context.Context, r JoinRequest) (endpoint string, peer *authorityPeer, ticket string, err error) {
	conn, err := discoveryclient.Dial(r.Discovery, r.DiscoveryFingerprint)
	if err != nil {
		return "", nil, "", err
	}
	defer conn.Close()
	client := musterv1.NewDiscoveryServiceClient(conn)
	if endpoint, peer, err = a.locateWith(ctx, client, r); err != nil {
		return "", nil, "", err
	}
	tctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	t, err := client.RequestReferralTicket(tctx, &musterv1.RequestReferralTicketRequest{AuthorityId: r.AuthorityID, NodeId: r.Node})
	if err != nil {
		return "", nil, "", discoveryError(r, "referral ticket", err)
	}
	return endpoint, peer, t.GetTicket(), nil
}

// locate looks the authority up through discovery and returns the first
// endpoint that proves to be it (see locateWith).
func (a *Agent) locate(ctx context.Context, r JoinRequest) (string, *authorityPeer, error) {
	conn, err := discoveryclient.Dial(r.Discovery, r.DiscoveryFingerprint)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close()
	return a.locateWith(ctx, musterv1.NewDiscoveryServiceClient(conn), r)
}

// locateWith looks the authority up, refuses a listing whose root is not
// the pinned one, and probes its endpoints in order until one proves, by
// the pinned root and the authority SAN, to be that authority (discovery's
// own certificate never carries that SAN, so a discovery posing as the
// authority gets nothing). Nothing is sent to an endpoint before it
// proves.
func (a *Agent) locateWith(ctx context.Context, client musterv1.DiscoveryServiceClient, r JoinRequest) (endpoint string, peer *authorityPeer, err error) {
	cctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	look, err := client.LookupAuthority(cctx, &musterv1.LookupAuthorityRequest{AuthorityId: r.AuthorityID})
	if err != nil {
		return "", nil, discoveryError(r, "looking up "+r.AuthorityID, err)
	}
	if fps := listedRoots(look); !slices.ContainsFunc(fps, func(fp string) bool { return ca.SameFingerprint(fp, r.CAFingerprint) }) {
		return "", nil, &refusal{codes.PermissionDenied, fmt.Errorf("%w %s: discovery lists authority %s with root %s; nothing was sent; %s",
			ErrPinnedRoot, r.CAFingerprint, r.AuthorityID, strings.Join(fps, " or "), pinnedRootHint)}
	}
	var errs []error
	unreachable := true
	for _, ep := range look.GetEndpoints() {
		probe := r
		probe.Authority = ep
		if peer, err = a.probeAuthority(ctx, probe); err == nil {
			return ep, peer, nil
		}
		errs = append(errs, err)
		unreachable = unreachable && Transient(err)
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("discovery lists no endpoint"))
		unreachable = false
	}
	if unreachable {
		// Nothing answered: the authority is down or not reachable from
		// here, which may pass (agent run retries UNAVAILABLE), not an
		// endpoint that failed to prove itself.
		return "", nil, &refusal{codes.Unavailable, fmt.Errorf("authority %s does not answer at %s, the endpoints discovery %s lists for it: %w; "+
			"start it, or check that this machine reaches it (muster agent run retries until it answers); "+
			"muster discovery lookup %s --discovery %s%s shows the endpoints it registered",
			r.AuthorityID, strings.Join(look.GetEndpoints(), ", "), r.Discovery, errors.Join(errs...),
			r.AuthorityID, r.Discovery, discoveryPinFlag(r.DiscoveryFingerprint))}
	}
	return "", nil, fmt.Errorf("no endpoint of authority %s proved to be it: %w", r.AuthorityID, errors.Join(errs...))
}

// pinnedRootHint is the way out of a pin that is not the authority's root:
// after a root rotation's standby the old root is no longer the
// authority's, and a fingerprint copied from elsewhere (discovery's own,
// say) never was. The fingerprint to pin comes from the authority's
// operator, never from what discovery or the server says.
const pinnedRootHint = "if the authority's root was rotated (muster ca root rotate), or this is not its fingerprint, " +
	"pin the root it uses now (--ca-fingerprint, MUSTER_CA_FINGERPRINT, or the joining URI's fingerprint=): " +
	"muster ca root status on the authority prints it as \"Joining URIs pin\""

// discoveryPinFlag is the discovery pin as a command's flag: the one the
// agent was given, or none when it trusts the system roots.
func discoveryPinFlag(fp string) string {
	if fp == "" {
		return ""
	}
	return " --discovery-fingerprint " + fp
}

// listedRoots are the roots discovery lists for an authority: during and
// after a root rotation, the roots its registration links to the root the
// ID names (discovery checked the links); otherwise that root alone. It
// only spares a probe of an authority that cannot be the pinned one: the
// probe's TLS check against the pinned root decides.
func listedRoots(look *musterv1.LookupAuthorityResponse) []string {
	if roots, err := discovery.ParseRoots(look.GetCaBundlePem()); err == nil && ca.SameFingerprint(ca.Fingerprint(roots.Anchor), look.GetCaFingerprint()) {
		return roots.Fingerprints()
	}
	return []string{look.GetCaFingerprint()}
}

// pskRefusalHint adds to a PSK refusal the way out: a PSK that no longer
// matches is, on a machine that once had the right one, one rotated away
// (muster psk rotate keeps the previous PSK for its grace only, and a
// second rotation revokes a PSK still in grace). The code, the message's
// start and the details (the reason word) stay.
func pskRefusalHint(err error, node string) error {
	var hint string
	switch errinfo.Reason(err) {
	case "psk_mismatch":
		hint = "if the PSK was rotated (muster psk rotate), give this machine the active one: muster psk show on the authority prints it"
	case "psk_missing":
		hint = "give the PSK (--psk-file, MUSTER_BOOTSTRAP_PSK): muster psk show on the authority prints it"
	case "node_taken":
		hint = nodeTakenHint(node)
	case "locked":
		hint = joinLockedHint(node)
	default:
		return err
	}
	return withHint(err, hint)
}
