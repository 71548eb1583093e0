package e2e

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// dialFrom connects as the client at source behind a trusted TCP load
// balancer (a PROXY protocol header, then TLS with id, nil for none), so
// that every call of a test has its own source address: its own rate
// limit, and audit records a test can attribute to it.
func (e *joinEnv) dialFrom(t *testing.T, source string, id *identity.Identity) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(e.root)
	want, _ := spiffeid.New(e.td, spiffeid.RoleAuthority, e.td)
	conn, err := grpc.NewClient(e.auth.addr,
		grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, pool, identity.MatchID(want)))),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			_, err = c.Write([]byte("PROXY TCP4 " + source + " 127.0.0.1 40000 7443\r\n"))
			return c, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// csrOf is a PKCS#10 request signed by key, with what tmpl adds.
func csrOf(t *testing.T, key crypto.Signer, tmpl x509.CertificateRequest) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// authorityState is what a refused request must not change, as the admin
// API lists it: tokens with their use and recovery counts and bindings,
// agents with their instance and generation, locks and operators.
func authorityState(t *testing.T, c musterv1.AdminServiceClient) string {
	t.Helper()
	var b strings.Builder
	toks, err := c.ListTokens(t.Context(), &musterv1.ListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range toks.GetTokens() {
		bs := k.GetBoundKeypairStatus()
		fmt.Fprintf(&b, "token %s %s uses=%d state=%s bound=%s/%s recoveries=%d/%d\n", k.GetId(), k.GetJoinMethod(), k.GetUsesCount(),
			k.GetState(), bs.GetBoundPublicKey(), bs.GetBoundInstanceId(), bs.GetRecoveryCount(), bs.GetRecoverySequence())
	}
	agents, err := c.ListAgents(t.Context(), &musterv1.ListAgentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents.GetAgents() {
		fmt.Fprintf(&b, "agent %s %s gen=%d not_after=%v locked=%s\n", a.GetNodeId(), a.GetInstanceId(), a.GetGeneration(),
			a.GetNotAfter().AsTime(), a.GetLocked())
	}
	locks, err := c.ListLocks(t.Context(), &musterv1.ListLocksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks.GetLocks() {
		fmt.Fprintf(&b, "lock %s %s %s\n", l.GetId(), l.GetKind(), l.GetTarget())
	}
	ops, err := c.ListOperators(t.Context(), &musterv1.ListOperatorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range ops.GetOperators() {
		fmt.Fprintf(&b, "operator %s %s\n", o.GetName(), o.GetSerial())
	}
	return b.String()
}

// jwt is a compact JWS over payload with header alg and the given
// signature function (nil for none).
func jwt(alg string, payload []byte, sign func([]byte) []byte) string {
	enc := base64.RawURLEncoding.EncodeToString
	input := enc([]byte(`{"alg":"`+alg+`","typ":"JWT"}`)) + "." + enc(payload)
	if sign == nil {
		return input + "."
	}
	return input + "." + enc(sign([]byte(input)))
}

// boundStream runs a RegisterUsingBoundKeypair stream as a hostile client:
// it sends init (if any), then, once a challenge comes, what answer makes
// of it ("" to end the stream there, a truncated exchange); with no init
// it sends first as the first message. It returns how the stream ended.
func boundStream(ctx context.Context, conn *grpc.ClientConn, first *musterv1.RegisterUsingBoundKeypairRequest, answer func(challenge []byte) string) error {
	s, err := musterv1.NewJoinServiceClient(conn).RegisterUsingBoundKeypair(ctx)
	if err != nil {
		return err
	}
	if first != nil {
		if err := s.Send(first); err != nil && err != io.EOF {
			return err
		}
	}
	if answer == nil {
		s.CloseSend()
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return err
		}
		if ch := m.GetChallenge(); ch != nil {
			if answer == nil {
				return fmt.Errorf("a challenge came after the stream was closed")
			}
			resp := answer(ch)
			if resp != "" {
				s.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_ChallengeResponse{ChallengeResponse: resp}})
			}
			s.CloseSend()
		}
		if m.GetResult() != nil {
			return fmt.Errorf("the stream gave a certificate")
		}
	}
}

// rawStream opens method as a bidirectional stream, sends body as it is,
// and returns how the stream ended.
func rawStream(ctx context.Context, conn *grpc.ClientConn, method string, body []byte) error {
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	if body != nil {
		s.SendMsg(body)
	}
	s.CloseSend()
	for {
		var out []byte
		if err := s.RecvMsg(&out); err != nil {
			return err
		}
	}
}

// TestHostileRequests sends malformed and hostile requests through the
// real binary, each from its own source address: every one is answered
// with its code and a message that says why, changes nothing the admin
// API lists (tokens and their counts, agents, locks, operators), and
// leaves an audit record from its source. It extends the refusals of
// badinput_test.go and the check-order tables of join_test.go and
// psk_join_test.go, which it does not repeat.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	dir, init := initDir(t)
	e := &joinEnv{dir: dir, auth: startAuthority(t, dir, "--trusted-proxy", "127.0.0.1")}
	e.setup(t)
	psk := init["bootstrap_psk"].(string)
	op, err := identity.Load(filepath.Join(dir, "operator.pem"))
	if err != nil {
		t.Fatal(err)
	}
	admin := operatorAdmin(t, dir, e.auth.addr)

	// What there is to attack: an unused token, an enrolled agent, a
	// bound-keypair token bound to a key and one waiting for its
	// registration secret.
	good := e.token(t, "--uses", "5")
	agent, _ := e.join(t, e.token(t), "enrolled")
	adir := filepath.Join(t.TempDir(), "bot")
	pubLine := strings.TrimSpace(mustRun(t, "keypair", "create", "--data", adir))
	keyFile := filepath.Join(t.TempDir(), "bot.pub")
	if err := os.WriteFile(keyFile, []byte(pubLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "bot", "add", "bot-key", "--public-key", keyFile, "--data", dir)
	mustRun(t, "bot", "add", "bot-secret", "--data", dir)

	p256 := func() *ecdsa.PrivateKey { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k }
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p521, _ := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	caTrue, _ := asn1.Marshal(struct{ IsCA bool }{true})
	csrs := map[string][]byte{
		"rsa":        csrOf(t, rsaKey, x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}}),
		"p384":       csrOf(t, p384, x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}}),
		"p521":       csrOf(t, p521, x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}}),
		"ed25519":    csrOf(t, edKey, x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}}),
		"ca":         csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}, ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: caTrue}}}),
		"truncated":  csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}})[:60],
		"pem-junk":   []byte("-----BEGIN CERTIFICATE REQUEST-----\nnot base64 at all\n-----END CERTIFICATE REQUEST-----\n"),
		"cert-pem":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: e.root.Raw}),
		"badsig":     nil,
		"cn-path":    csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: "../enrolled"}}),
		"cn-upper":   csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: "Enrolled"}}),
		"cn-unicode": csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: "enrоlled"}}), // Cyrillic о
		"cn-nul":     csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: "enrolled\x00x"}}),
		"cn-long":    csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: strings.Repeat("a", 300)}}),
	}
	bad := slices.Clone(csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}}))
	bad[len(bad)-3] ^= 0xff // inside the signature
	csrs["badsig"] = bad
	_, fine := newCSR(t)

	exchange := func(token, node string, csr []byte) func(context.Context, *grpc.ClientConn) error {
		return func(ctx context.Context, c *grpc.ClientConn) error {
			_, err := musterv1.NewBootstrapServiceClient(c).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{JoinToken: token, NodeId: node, Csr: csr})
			return err
		}
	}
	bootstrap := func(psk string, csr []byte, ticket string) func(context.Context, *grpc.ClientConn) error {
		return func(ctx context.Context, c *grpc.ClientConn) error {
			_, err := musterv1.NewCertificateServiceClient(c).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: csr, BootstrapPsk: psk, ReferralTicket: ticket})
			return err
		}
	}
	renew := func(csr []byte) func(context.Context, *grpc.ClientConn) error { return bootstrap("", csr, "") }
	adminCall := func(f func(context.Context, musterv1.AdminServiceClient) error) func(context.Context, *grpc.ClientConn) error {
		return func(ctx context.Context, c *grpc.ClientConn) error { return f(ctx, musterv1.NewAdminServiceClient(c)) }
	}
	createToken := func(req *musterv1.CreateTokenRequest) func(context.Context, *grpc.ClientConn) error {
		return adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.CreateToken(ctx, req)
			return err
		})
	}
	bound := func(init *musterv1.BoundKeypairInit, answer func([]byte) string) func(context.Context, *grpc.ClientConn) error {
		return func(ctx context.Context, c *grpc.ClientConn) error {
			var first *musterv1.RegisterUsingBoundKeypairRequest
			if init != nil {
				first = &musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_Init{Init: init}}
			}
			return boundStream(ctx, c, first, answer)
		}
	}
	_, otherEd, _ := ed25519.GenerateKey(rand.Reader)
	_, registrant, _ := ed25519.GenerateKey(rand.Reader)
	botPub := strings.Fields(pubLine)
	forgedState := jwt("none", []byte(`{"instance_id":"x","sequence":1}`), nil)
	const connect = "/muster.v1.AgentService/Connect"
	agentConnect := func(body []byte) func(context.Context, *grpc.ClientConn) error {
		return func(ctx context.Context, c *grpc.ClientConn) error { return rawStream(ctx, c, connect, body) }
	}

	type call = func(context.Context, *grpc.ClientConn) error
	var (
		none     *identity.Identity
		long     = strings.Repeat("a", 40<<10)
		longNode = strings.Repeat("n", 254)
	)
	rows := []struct {
		name string
		as   *identity.Identity
		call call
		code codes.Code
		msg  string
	}{
		// Join tokens: fields oversized or of the wrong shape.
		{"token 40 KiB", none, exchange(long, "n1", fine), codes.InvalidArgument, "malformed"},
		{"token secret 40 KiB", none, exchange(good[:7]+long, "n1", fine), codes.InvalidArgument, "malformed"},
		{"token upper-case ID", none, exchange(strings.ToUpper(good), "n1", fine), codes.InvalidArgument, "malformed"},
		{"token with a unicode dot", none, exchange(good[:6]+"․"+good[7:], "n1", fine), codes.InvalidArgument, "malformed"},
		{"token with a NUL", none, exchange(good+"\x00", "n1", fine), codes.InvalidArgument, "malformed"},
		{"token with a space", none, exchange(" "+good, "n1", fine), codes.InvalidArgument, "malformed"},
		{"token as a joining URI", none, exchange("muster://"+good, "n1", fine), codes.InvalidArgument, "malformed"},
		// Node IDs with path, case and unicode tricks.
		{"node 40 KiB", none, exchange(good, long, fine), codes.InvalidArgument, "node_id"},
		{"node 254 characters", none, exchange(good, longNode, fine), codes.InvalidArgument, "node_id"},
		{"node ../enrolled", none, exchange(good, "../enrolled", fine), codes.InvalidArgument, "node_id"},
		{"node a/b", none, exchange(good, "a/b", fine), codes.InvalidArgument, "node_id"},
		{"node ..", none, exchange(good, "..", fine), codes.InvalidArgument, "node_id"},
		{"node Enrolled (case)", none, exchange(good, "Enrolled", fine), codes.InvalidArgument, "node_id"},
		{"node with Cyrillic о", none, exchange(good, "enrоlled", fine), codes.InvalidArgument, "node_id"},
		{"node with a fullwidth letter", none, exchange(good, "ｅnrolled", fine), codes.InvalidArgument, "node_id"},
		{"node with NUL", none, exchange(good, "enrolled\x00", fine), codes.InvalidArgument, "node_id"},
		{"node with a newline", none, exchange(good, "enrolled\n", fine), codes.InvalidArgument, "node_id"},
		{"node with a trailing dot", none, exchange(good, "enrolled.", fine), codes.InvalidArgument, "node_id"},
		{"node with percent-encoding", none, exchange(good, "%2e%2e", fine), codes.InvalidArgument, "node_id"},
		// CSRs a good token must not turn into a certificate.
		{"CSR with an RSA key", none, exchange(good, "n1", csrs["rsa"]), codes.InvalidArgument, "csr"},
		{"CSR with a P-384 key", none, exchange(good, "n1", csrs["p384"]), codes.InvalidArgument, "csr"},
		{"CSR with a P-521 key", none, exchange(good, "n1", csrs["p521"]), codes.InvalidArgument, "csr"},
		{"CSR with an invalid signature", none, exchange(good, "n1", csrs["badsig"]), codes.InvalidArgument, "csr"},
		{"CSR truncated", none, exchange(good, "n1", csrs["truncated"]), codes.InvalidArgument, "csr"},
		{"CSR PEM that is not base64", none, exchange(good, "n1", csrs["pem-junk"]), codes.InvalidArgument, "csr"},
		{"a certificate as the CSR", none, exchange(good, "n1", csrs["cert-pem"]), codes.InvalidArgument, "csr"},
		// PSK bootstraps: the PSK and the node ID (the CSR's CN).
		{"PSK 40 KiB", none, bootstrap("muster-psk:"+long, fine, ""), codes.InvalidArgument, "malformed"},
		{"PSK without its prefix", none, bootstrap(strings.TrimPrefix(psk, "muster-psk:"), fine, ""), codes.InvalidArgument, "muster-psk:"},
		{"PSK all zero", none, bootstrap("muster-psk:"+strings.Repeat("0", 64), fine, ""), codes.InvalidArgument, "all zeros"},
		{"PSK in upper-case hex", none, bootstrap(strings.ToUpper(psk), fine, ""), codes.InvalidArgument, "malformed"},
		{"PSK CN ../enrolled", none, bootstrap(psk, csrs["cn-path"], ""), codes.InvalidArgument, "node ID"},
		{"PSK CN Enrolled", none, bootstrap(psk, csrs["cn-upper"], ""), codes.InvalidArgument, "node ID"},
		{"PSK CN with Cyrillic о", none, bootstrap(psk, csrs["cn-unicode"], ""), codes.InvalidArgument, "node ID"},
		{"PSK CN with NUL", none, bootstrap(psk, csrs["cn-nul"], ""), codes.InvalidArgument, "node ID"},
		{"PSK CN 300 characters", none, bootstrap(psk, csrs["cn-long"], ""), codes.InvalidArgument, "node ID"},
		{"PSK with an RSA CSR", none, bootstrap(psk, csrs["rsa"], ""), codes.InvalidArgument, "csr"},
		{"PSK with a P-521 CSR", none, bootstrap(psk, csrs["p521"], ""), codes.InvalidArgument, "csr"},
		// Referral tickets: this authority has no discovery service, so
		// every ticket, forged or not, is refused before it is read.
		{"alg:none referral ticket", none, bootstrap("", fine, jwt("none", []byte(`{"sub":"n1"}`), nil)), codes.InvalidArgument, "discovery service"},
		{"HS256 referral ticket", none, bootstrap("", fine, jwt("HS256", []byte(`{"sub":"n1"}`), func(in []byte) []byte {
			m := hmac.New(sha256.New, e.root.Raw)
			m.Write(in)
			return m.Sum(nil)
		})), codes.InvalidArgument, "discovery service"},
		// Renewals: the agent's own certificate, a CSR it should not send.
		{"renewal with an RSA CSR", agent, renew(csrs["rsa"]), codes.InvalidArgument, "csr"},
		{"renewal with a P-384 CSR", agent, renew(csrs["p384"]), codes.InvalidArgument, "csr"},
		{"renewal with an invalid signature", agent, renew(csrs["badsig"]), codes.InvalidArgument, "csr"},
		{"renewal without a CSR", agent, renew(nil), codes.InvalidArgument, "csr"},
		// The agent's certificate on the admin API.
		{"agent lists tokens", agent, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.ListTokens(ctx, &musterv1.ListTokensRequest{})
			return err
		}), codes.PermissionDenied, "admin intermediate"},
		{"agent creates a token", agent, createToken(&musterv1.CreateTokenRequest{}), codes.PermissionDenied, "admin intermediate"},
		{"agent unlocks", agent, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.CreateLock(ctx, &musterv1.CreateLockRequest{Kind: "node", Target: "enrolled"})
			return err
		}), codes.PermissionDenied, "admin intermediate"},
		{"agent deletes itself", agent, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.DeleteAgent(ctx, &musterv1.DeleteAgentRequest{NodeId: "enrolled"})
			return err
		}), codes.PermissionDenied, "admin intermediate"},
		{"agent adds an operator", agent, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.AddOperator(ctx, &musterv1.AddOperatorRequest{Name: "mallory", Csr: fine})
			return err
		}), codes.PermissionDenied, "admin intermediate"},
		{"agent renews as an operator", agent, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.RenewOperator(ctx, &musterv1.RenewOperatorRequest{Csr: fine})
			return err
		}), codes.PermissionDenied, "admin intermediate"},
		// The operator's certificate as an agent.
		{"operator renews", op, renew(fine), codes.PermissionDenied, "agent"},
		{"operator renews with an RSA CSR", op, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.RenewOperator(ctx, &musterv1.RenewOperatorRequest{Csr: csrs["rsa"]})
			return err
		}), codes.InvalidArgument, "key type not allowed"},
		{"operator renews for two years", op, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.RenewOperator(ctx, &musterv1.RenewOperatorRequest{Csr: fine, Ttl: durationpb.New(2 * 366 * 24 * time.Hour)})
			return err
		}), codes.InvalidArgument, "ttl"},
		{"operator asks for verifier sets", op, func(ctx context.Context, c *grpc.ClientConn) error {
			_, err := musterv1.NewAgentServiceClient(c).GetVerifierSet(ctx, &musterv1.GetVerifierSetRequest{})
			return err
		}, codes.PermissionDenied, "agent"},
		{"operator opens an agent stream", op, agentConnect(nil), codes.PermissionDenied, "agent"},
		// Admin requests with values out of range.
		{"token with -1 uses", op, createToken(&musterv1.CreateTokenRequest{Uses: ptr(int64(-1))}), codes.InvalidArgument, "uses"},
		{"token with a negative TTL", op, createToken(&musterv1.CreateTokenRequest{Ttl: durationpb.New(-time.Hour)}), codes.InvalidArgument, "ttl"},
		{"token bound to ../x", op, createToken(&musterv1.CreateTokenRequest{NodeId: "../x"}), codes.InvalidArgument, "node"},
		{"operator named ../x", op, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.AddOperator(ctx, &musterv1.AddOperatorRequest{Name: "../x", Csr: fine})
			return err
		}), codes.InvalidArgument, "name"},
		{"operator with an RSA CSR", op, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.AddOperator(ctx, &musterv1.AddOperatorRequest{Name: "carol", Csr: csrs["rsa"]})
			return err
		}), codes.InvalidArgument, "key type not allowed"},
		{"lock of an unknown kind", op, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.CreateLock(ctx, &musterv1.CreateLockRequest{Kind: "everything", Target: "x"})
			return err
		}), codes.InvalidArgument, "kind"},
		{"delete agent ../enrolled", op, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.DeleteAgent(ctx, &musterv1.DeleteAgentRequest{NodeId: "../enrolled"})
			return err
		}), codes.InvalidArgument, "node"},
		{"bound-keypair token named ../x", op, adminCall(func(ctx context.Context, c musterv1.AdminServiceClient) error {
			_, err := c.ApplyToken(ctx, &musterv1.ApplyTokenRequest{Name: "../x", BoundKeypair: &musterv1.BoundKeypairSpec{}})
			return err
		}), codes.InvalidArgument, "name"},
		// Bound-keypair streams.
		{"bound stream closed at once", none, bound(nil, nil), codes.InvalidArgument, "ended before init"},
		{"bound stream opening with an answer", none, func(ctx context.Context, c *grpc.ClientConn) error {
			return boundStream(ctx, c, &musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_ChallengeResponse{ChallengeResponse: "x.y.z"}}, nil)
		}, codes.InvalidArgument, "init"},
		{"bound stream for an unknown token", none, bound(&musterv1.BoundKeypairInit{Token: "nobody", NodeId: "nobody", Csr: fine}, nil), codes.NotFound, "unknown"},
		{"bound stream with node ../bot-key", none, bound(&musterv1.BoundKeypairInit{Token: "bot-key", NodeId: "../bot-key", Csr: fine}, nil), codes.InvalidArgument, "node"},
		{"bound stream with an RSA CSR", none, bound(&musterv1.BoundKeypairInit{Token: "bot-key", NodeId: "bot-key", Csr: csrs["rsa"]}, nil), codes.InvalidArgument, "csr"},
		{"bound stream truncated after the challenge", none, bound(&musterv1.BoundKeypairInit{Token: "bot-key", NodeId: "bot-key", Csr: fine},
			func([]byte) string { return "" }), codes.InvalidArgument, "not answered"},
		{"bound challenge answered alg:none", none, bound(&musterv1.BoundKeypairInit{Token: "bot-key", NodeId: "bot-key", Csr: fine},
			func(ch []byte) string { return jwt("none", ch, nil) }), codes.Unauthenticated, "challenge_failed"},
		{"bound challenge answered HS256 keyed with the public key", none, bound(&musterv1.BoundKeypairInit{Token: "bot-key", NodeId: "bot-key", Csr: fine},
			func(ch []byte) string {
				return jwt("HS256", ch, func(in []byte) []byte {
					m := hmac.New(sha256.New, []byte(botPub[len(botPub)-1]))
					m.Write(in)
					return m.Sum(nil)
				})
			}), codes.Unauthenticated, "challenge_failed"},
		{"bound challenge signed by another key", none, bound(&musterv1.BoundKeypairInit{Token: "bot-key", NodeId: "bot-key", Csr: fine},
			func(ch []byte) string {
				return jwt("EdDSA", ch, func(in []byte) []byte { return ed25519.Sign(otherEd, in) })
			}), codes.Unauthenticated, "challenge_failed"},
		{"bound challenge, another key and a forged join state", none, bound(&musterv1.BoundKeypairInit{Token: "bot-key", NodeId: "bot-key", Csr: fine, PreviousJoinState: forgedState},
			func(ch []byte) string {
				return jwt("EdDSA", ch, func(in []byte) []byte { return ed25519.Sign(otherEd, in) })
			}), codes.Unauthenticated, "challenge_failed"},
		{"bound registration with a wrong secret", none, bound(&musterv1.BoundKeypairInit{Token: "bot-secret", NodeId: "bot-secret", Csr: fine,
			RegistrationSecret: "wrong", PublicKey: authorizedKey(registrant)}, nil), codes.Unauthenticated, "challenge_failed"},
		// A key is bound: registering another is closed (DESIGN.md's
		// registration_closed), whatever secret comes with it.
		{"bound registration of a second key", none, bound(&musterv1.BoundKeypairInit{Token: "bot-key", NodeId: "bot-key", Csr: fine,
			RegistrationSecret: "anything", PublicKey: authorizedKey(registrant)},
			func(ch []byte) string {
				return jwt("EdDSA", ch, func(in []byte) []byte { return ed25519.Sign(registrant, in) })
			}), codes.FailedPrecondition, "registration_closed"},
		// The agent's stream.
		{"agent stream without a certificate", none, agentConnect(nil), codes.Unauthenticated, "certificate"},
		{"agent stream sending junk", agent, agentConnect([]byte{0xff, 0x01}), codes.InvalidArgument, "not a valid protobuf message"},
		{"agent stream sending 100 KiB", agent, agentConnect(make([]byte, 100<<10)), codes.ResourceExhausted, "larger than"},
	}
	for i, tt := range rows {
		source := fmt.Sprintf("198.51.%d.%d", 100+i/250, 1+i%250)
		t.Run(tt.name, func(t *testing.T) {
			before := authorityState(t, admin)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			err := tt.call(ctx, e.dialFrom(t, source, tt.as))
			if s := status.Convert(err); s.Code() != tt.code || !strings.Contains(s.Message(), tt.msg) {
				t.Errorf("got %v, want %v containing %q", err, tt.code, tt.msg)
			}
			if after := authorityState(t, admin); after != before {
				t.Errorf("the refusal changed the authority:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	t.Logf("%d hostile requests", len(rows))

	// Every refusal is audited from its own source.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var recs []struct{ Source, Result, Reason string }
		if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "--limit", "1000", "-o", "json")), &recs); err != nil {
			t.Fatal(err)
		}
		audited := map[string]bool{}
		for _, r := range recs {
			if r.Result != "ok" && r.Reason != "" {
				audited[r.Source] = true
			}
		}
		var missing []string
		for i, tt := range rows {
			if !audited[fmt.Sprintf("198.51.%d.%d", 100+i/250, 1+i%250)] {
				missing = append(missing, tt.name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d refusals left no audit record: %q", len(missing), missing)
		}
		time.Sleep(300 * time.Millisecond)
	}
	mustRun(t, "audit", "verify", "--data", dir)

	// A CSR is only a public key: one asking for CA:true and extra SANs
	// (another node, another trust domain, a DNS name, an email) is not
	// refused, but nothing it asks for reaches the certificate.
	uri, _ := url.Parse("spiffe://evil.example/agent/enrolled")
	greedy := csrOf(t, p256(), x509.CertificateRequest{Subject: pkix.Name{CommonName: "greedy"},
		DNSNames: []string{"authority.example"}, EmailAddresses: []string{"root@example.com"}, URIs: []*url.URL{uri},
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: caTrue}}})
	resp, err := e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: good, NodeId: "greedy", Csr: greedy})
	if err != nil {
		t.Fatal(err)
	}
	leaf := e.agentID(t, resp.GetCertificateChainPem(), nil).Chain[0]
	want, _ := spiffeid.New(e.td, spiffeid.RoleAgent, "greedy")
	if leaf.IsCA || len(leaf.DNSNames)+len(leaf.EmailAddresses)+len(leaf.IPAddresses) != 0 || len(leaf.URIs) != 1 || leaf.URIs[0].String() != want.URL().String() {
		t.Fatalf("a greedy CSR got CA=%v DNS=%v email=%v URIs=%v", leaf.IsCA, leaf.DNSNames, leaf.EmailAddresses, leaf.URIs)
	}
}

func ptr[T any](v T) *T { return &v }

// authorizedKey is key's public half in authorized_keys form.
func authorizedKey(key ed25519.PrivateKey) string {
	pub, _ := boundkeypair.NewPublicKey(key.Public().(ed25519.PublicKey))
	return pub.String()
}
