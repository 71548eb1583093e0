package agent

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/jwtsvid"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// fakeAuthority is an in-process gRPC authority with a real CA hierarchy:
// enough of BootstrapService and CertificateService to join and renew,
// recording what it was sent.
type fakeAuthority struct {
	musterv1.UnimplementedBootstrapServiceServer
	musterv1.UnimplementedCertificateServiceServer
	musterv1.UnimplementedJoinServiceServer

	h     *ca.Hierarchy
	aid   string
	token jointoken.Token
	addr  string
	ttl   time.Duration

	mu          sync.Mutex
	bundleReqs  []string // token IDs asked for
	exchanges   []string // join tokens received
	renewKeys   []crypto.PublicKey
	generation  int64
	issued      map[string]*x509.Certificate // by key, for retries
	exchangeErr error
	// renewErrs are answered, one per renewal, before renewals succeed.
	renewErrs []error
	// loseRenewReply issues a certificate but answers UNAVAILABLE, once.
	loseRenewReply bool
	// wrongKey certifies a key other than the CSR's.
	wrongKey bool
	// extraBundle is added to the trust bundle every answer carries
	// (the root and the intermediates of h).
	extraBundle trustbundle.Set
	// leafIssuer, if set, signs the certificates of bound-keypair
	// refreshes instead of h's agent intermediate.
	leafIssuer *ca.Issuer
	// boundInstance, if set, is the instance bound-keypair refreshes are
	// answered with (else instance-1, the join's).
	boundInstance *string
	// boundErrs are answered, one per bound-keypair stream, to its init
	// before the streams are served.
	boundErrs []error
	// renewHold, if set, holds the next renewal until it is closed,
	// after telling renewHeld that it arrived.
	renewHold, renewHeld chan struct{}
	// mintJWT, if set, has mints answer a JWT-SVID signed with it, its
	// iat the clock mintClock (the authority's), in place of the serial.
	mintJWT   *jwtsvid.Issuer
	mintClock func() time.Time
	// mintHold, if set, holds the next JWT-SVID mint until it is closed,
	// after closing mintHeld.
	mintHold, mintHeld chan struct{}
	// conns counts the connections accepted, open those not closed yet.
	conns, open atomic.Int64
	// mints counts the JWT-SVID mints asked for.
	mints atomic.Int64
	// connect, if set, serves AgentService.Connect (else UNIMPLEMENTED).
	connect func(musterv1.AgentService_ConnectServer) error
}

// countingListener counts f's connections.
type countingListener struct {
	net.Listener
	f *fakeAuthority
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.f.conns.Add(1)
		l.f.open.Add(1)
		c = &countedConn{Conn: c, f: l.f}
	}
	return c, err
}

type countedConn struct {
	net.Conn
	f    *fakeAuthority
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.f.open.Add(-1) })
	return c.Conn.Close()
}

// trustBundle is what the fake's answers carry.
func (f *fakeAuthority) trustBundle() *musterv1.TrustBundle {
	b := &musterv1.TrustBundle{AuthorityId: f.aid, Roots: [][]byte{f.h.Root.Raw}}
	for _, r := range []ca.Role{ca.RoleBootstrap, ca.RoleServer, ca.RoleAgent, ca.RoleAdmin} {
		b.Intermediates = append(b.Intermediates, f.h.Issuers[r].Cert.Raw)
	}
	for _, c := range f.extraBundle.Roots {
		b.Roots = append(b.Roots, c.Raw)
	}
	for _, c := range f.extraBundle.Intermediates {
		b.Intermediates = append(b.Intermediates, c.Raw)
	}
	for _, c := range f.extraBundle.Cross {
		b.CrossCertificates = append(b.CrossCertificates, c.Raw)
	}
	return b
}

type fakeOptions struct {
	// serverID replaces the authority's SPIFFE ID in its TLS certificate.
	serverID *url.URL
	ttl      time.Duration
}

func newFakeAuthority(t *testing.T, o fakeOptions) *fakeAuthority {
	t.Helper()
	h, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jointoken.Generate()
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAuthority{h: h, aid: ca.AuthorityID("test", h.Fingerprint()), token: tok, ttl: o.ttl,
		issued: map[string]*x509.Certificate{}}
	if f.ttl == 0 {
		f.ttl = time.Hour
	}
	id := o.serverID
	if id == nil {
		sid, _ := spiffeid.New(f.aid, spiffeid.RoleAuthority, f.aid)
		id = sid.URL()
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srv := h.Issuer(ca.RoleServer)
	leaf, err := srv.Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id, ServerAuth: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw, srv.Cert.Raw}, PrivateKey: key, Leaf: leaf}},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    h.RootPool(),
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = lis.Addr().String()
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)))
	musterv1.RegisterBootstrapServiceServer(gs, f)
	musterv1.RegisterCertificateServiceServer(gs, f)
	musterv1.RegisterJoinServiceServer(gs, f)
	musterv1.RegisterAgentServiceServer(gs, fakeMinter{f: f})
	go gs.Serve(countingListener{Listener: lis, f: f})
	t.Cleanup(gs.Stop)
	return f
}

func (f *fakeAuthority) trustDomain() string { return f.aid }

func (f *fakeAuthority) GetTrustBundle(_ context.Context, req *musterv1.GetTrustBundleRequest) (*musterv1.GetTrustBundleResponse, error) {
	f.mu.Lock()
	f.bundleReqs = append(f.bundleReqs, req.GetTokenId())
	f.mu.Unlock()
	key := trustbundle.Key(req.GetTokenId(), []byte("decoy-decoy-decoy"))
	if req.GetTokenId() == f.token.ID {
		key = trustbundle.Key(f.token.ID, f.token.Secret())
	}
	b := trustbundle.Bundle{AuthorityID: f.aid, TrustDomain: f.trustDomain(),
		Roots: []string{string(ca.EncodeCertPEM(f.h.Root))}, Endpoints: []string{f.addr}}
	jws, err := trustbundle.Sign(b, req.GetTokenId(), key, time.Now())
	if err != nil {
		return nil, err
	}
	return &musterv1.GetTrustBundleResponse{Jws: jws}, nil
}

func (f *fakeAuthority) ExchangeJoinToken(_ context.Context, req *musterv1.ExchangeJoinTokenRequest) (*musterv1.ExchangeJoinTokenResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exchanges = append(f.exchanges, req.GetJoinToken())
	if f.exchangeErr != nil {
		return nil, f.exchangeErr
	}
	if req.GetJoinToken() != f.token.Reveal() {
		return nil, status.Error(codes.NotFound, "unknown join token or wrong secret")
	}
	chain, err := f.issue(req.GetNodeId(), req.GetCsr())
	if err != nil {
		return nil, err
	}
	return &musterv1.ExchangeJoinTokenResponse{CertificateChainPem: chain, CaCertificatePem: string(ca.EncodeCertPEM(f.h.Root)),
		InstanceId: "instance-1", Generation: 0, AuthorityId: f.aid, TrustDomain: f.trustDomain(), TrustBundle: f.trustBundle()}, nil
}

func (f *fakeAuthority) RequestCertificate(ctx context.Context, req *musterv1.RequestCertificateRequest) (*musterv1.RequestCertificateResponse, error) {
	p, _ := peer.FromContext(ctx)
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil, status.Error(codes.Unauthenticated, "no valid agent certificate")
	}
	id, err := spiffeid.FromCertificate(ti.State.PeerCertificates[0])
	if err != nil || id.Role != spiffeid.RoleAgent {
		return nil, status.Error(codes.PermissionDenied, "not an agent")
	}
	csr, err := ca.ParseCSR(req.GetCsr())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "csr")
	}
	f.mu.Lock()
	hold, held := f.renewHold, f.renewHeld
	f.renewHold = nil
	f.mu.Unlock()
	if hold != nil {
		held <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renewKeys = append(f.renewKeys, csr.PublicKey)
	if len(f.renewErrs) > 0 {
		err := f.renewErrs[0]
		f.renewErrs = f.renewErrs[1:]
		return nil, err
	}
	n := len(f.issued)
	chain, err := f.issue(id.Name, req.GetCsr())
	if err != nil {
		return nil, err
	}
	if len(f.issued) > n {
		f.generation++
	}
	if f.loseRenewReply {
		f.loseRenewReply = false
		return nil, status.Error(codes.Unavailable, "reply lost")
	}
	return &musterv1.RequestCertificateResponse{CertificateChainPem: chain, CaCertificatePem: string(ca.EncodeCertPEM(f.h.Root)),
		InstanceId: "instance-1", Generation: f.generation, TrustBundle: f.trustBundle()}, nil
}

// issue certifies the CSR's key for node; the same key gets the same
// certificate, as a retry does from the real authority.
func (f *fakeAuthority) issue(node string, csrDER []byte) (string, error) {
	csr, err := ca.ParseCSR(csrDER)
	if err != nil {
		return "", status.Error(codes.InvalidArgument, "csr")
	}
	agentIss := f.h.Issuer(ca.RoleAgent)
	pub := csr.PublicKey
	if f.wrongKey {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		pub = k.Public()
	}
	der, _ := x509.MarshalPKIXPublicKey(pub)
	if c, ok := f.issued[string(der)]; ok {
		return string(agentIss.ChainPEM(c)), nil
	}
	aid, err := spiffeid.New(f.trustDomain(), spiffeid.RoleAgent, node)
	if err != nil {
		return "", status.Error(codes.InvalidArgument, "node_id")
	}
	leaf, err := agentIss.Issue(ca.LeafRequest{PublicKey: pub, SPIFFEID: aid.URL(), CommonName: node, ClientAuth: true,
		NotBefore: time.Now(), TTL: f.ttl})
	if err != nil {
		return "", err
	}
	f.issued[string(der)] = leaf
	return string(agentIss.ChainPEM(leaf)), nil
}

func (f *fakeAuthority) calls() (bundles, exchanges, renewals int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bundleReqs), len(f.exchanges), len(f.renewKeys)
}

func (f *fakeAuthority) keys() []crypto.PublicKey {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]crypto.PublicKey(nil), f.renewKeys...)
}

// joinRequest is a correct request for the fake.
func (f *fakeAuthority) joinRequest(node string) JoinRequest {
	return JoinRequest{Token: f.token, Node: node, Authority: f.addr}
}

func newTestAgent(t *testing.T, dir Dir) *Agent {
	return New(Options{Dir: dir, Timeout: 5 * time.Second})
}

func codeOf(err error) codes.Code {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code()
	}
	return codes.OK
}

// fakeMinter answers MintJWTSVID with a "token" naming the serial of the
// client certificate the connection presented.
type fakeMinter struct {
	musterv1.UnimplementedAgentServiceServer
	f *fakeAuthority
}

func (m fakeMinter) Connect(stream musterv1.AgentService_ConnectServer) error {
	m.f.mu.Lock()
	connect := m.f.connect
	m.f.mu.Unlock()
	if connect == nil {
		return m.UnimplementedAgentServiceServer.Connect(stream)
	}
	return connect(stream)
}

func (m fakeMinter) MintJWTSVID(ctx context.Context, req *musterv1.MintJWTSVIDRequest) (*musterv1.MintJWTSVIDResponse, error) {
	m.f.mints.Add(1)
	m.f.mu.Lock()
	hold, held := m.f.mintHold, m.f.mintHeld
	m.f.mintHold = nil
	m.f.mu.Unlock()
	if hold != nil {
		close(held)
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	p, _ := peer.FromContext(ctx)
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil, status.Error(codes.Unauthenticated, "no client certificate")
	}
	m.f.mu.Lock()
	iss, clock := m.f.mintJWT, m.f.mintClock
	m.f.mu.Unlock()
	if iss != nil {
		now := clock()
		tok, exp, err := iss.Mint("spiffe://test/agent/n1", req.GetAudience(), now, now.Add(time.Hour))
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &musterv1.MintJWTSVIDResponse{Token: tok, ExpiresAt: timestamppb.New(exp)}, nil
	}
	return &musterv1.MintJWTSVIDResponse{Token: serialOf(ti.State.PeerCertificates[0]),
		ExpiresAt: timestamppb.New(time.Now().Add(5 * time.Minute))}, nil
}

// setBackoff sets the retry backoff of renewals, refreshes and
// recoveries to between lo and hi for the test, and puts it back after.
func setBackoff(t *testing.T, lo, hi time.Duration) {
	t.Helper()
	minB, maxB := backoffMin, backoffMax
	t.Cleanup(func() { backoffMin, backoffMax = minB, maxB })
	backoffMin, backoffMax = lo, hi
}

// setStreamBackoff sets the stream's reconnect backoff to between lo and
// hi for the test, and puts it back after.
func setStreamBackoff(t *testing.T, lo, hi time.Duration) {
	t.Helper()
	minB, maxB := streamBackoffMin, streamBackoffMax
	t.Cleanup(func() { streamBackoffMin, streamBackoffMax = minB, maxB })
	streamBackoffMin, streamBackoffMax = lo, hi
}
