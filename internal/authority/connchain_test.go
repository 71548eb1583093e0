package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestConnChainKept: a connection's verified chain is answered again
// without verifying while the intermediates, the roots and the time stay
// within what it was verified against; a change of the intermediates or
// of the roots, or a time outside every certificate's dates, verifies
// again, and an expired leaf is refused with its reason.
func TestConnChainKept(t *testing.T) {
	f := newLeafAloneFixture(t)
	s := f.srv
	id := f.identity(t, f.h, ca.RoleAgent, time.Now())
	leaf := id.Chain[0]
	now := time.Now()
	cc := &connChain{}
	first, err := s.verifyConnCerts(cc, id.Chain[:1], now)
	if err != nil {
		t.Fatal(err)
	}
	same := func(a, b []*x509.Certificate) bool { return &a[0] == &b[0] }
	if again, err := s.verifyConnCerts(cc, id.Chain[:1], now.Add(time.Minute)); err != nil || !same(first, again) {
		t.Fatalf("a second call within the dates: %v, kept chain answered: %v", err, err == nil && same(first, again))
	}
	// Without a connection's cell, every call verifies.
	if a, err := s.verifyConnCerts(nil, id.Chain[:1], now); err != nil || same(first, a) {
		t.Fatalf("no cell: %v; verified again: %v", err, err == nil && !same(first, a))
	}

	// A new set of intermediates (a rotation step, a retirement): verified again.
	f.h.SetIntermediates(&ca.Intermediates{Active: map[ca.Role]*ca.Issuer{ca.RoleAgent: f.h.Issuer(ca.RoleAgent)},
		Bundle: map[ca.Role][]*x509.Certificate{ca.RoleAgent: {f.h.Issuer(ca.RoleAgent).Cert}}})
	afterInter, err := s.verifyConnCerts(cc, id.Chain[:1], now)
	if err != nil || same(first, afterInter) {
		t.Fatalf("after an intermediates change: %v; verified again: %v", err, err == nil && !same(first, afterInter))
	}
	// An intermediate no longer accepted: refused on the next call.
	f.h.SetIntermediates(&ca.Intermediates{Active: map[ca.Role]*ca.Issuer{},
		Bundle: map[ca.Role][]*x509.Certificate{ca.RoleAgent: {f.other.Issuer(ca.RoleAgent).Cert}}})
	if _, err := s.verifyConnCerts(cc, id.Chain[:1], now); err == nil {
		t.Fatal("a leaf of an intermediate no longer accepted was answered from the connection's check")
	}
	f.h.SetIntermediates(&ca.Intermediates{Active: map[ca.Role]*ca.Issuer{ca.RoleAgent: f.h.Issuer(ca.RoleAgent)},
		Bundle: map[ca.Role][]*x509.Certificate{ca.RoleAgent: {f.h.Issuer(ca.RoleAgent).Cert}}})
	kept, err := s.verifyConnCerts(cc, id.Chain[:1], now)
	if err != nil {
		t.Fatal(err)
	}
	// The roots changed (a root rotation's phase; load sets them with the
	// intermediates, which tests here apart): verified again. A root no
	// longer trusted refusing an open connection's calls is
	// TestOpenConnectionRootDropped.
	f.h.SetRoots(&ca.RootSet{Trusted: []*x509.Certificate{f.h.Root}, Signing: f.h.Root})
	afterRoots, err := s.verifyConnCerts(cc, id.Chain[:1], now)
	if err != nil || same(kept, afterRoots) {
		t.Fatalf("after a roots change: %v; verified again: %v", err, err == nil && !same(kept, afterRoots))
	}
	if again, err := s.verifyConnCerts(cc, id.Chain[:1], now); err != nil || !same(afterRoots, again) {
		t.Fatalf("a call after the roots change was kept: %v, kept chain answered: %v", err, err == nil && same(afterRoots, again))
	}
	// Past the leaf's not-after: refused as expired, though the
	// connection's check is younger than the change of time.
	if _, err := s.verifyConnCerts(cc, id.Chain[:1], leaf.NotAfter.Add(time.Second)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("after the leaf's not-after: %v, want the expired refusal", err)
	}
	// Before its not-before: the same.
	if _, err := s.verifyConnCerts(cc, id.Chain[:1], leaf.NotBefore.Add(-time.Second)); err == nil || !strings.Contains(err.Error(), "expired or not yet valid") {
		t.Fatalf("before the leaf's not-before: %v, want the refusal", err)
	}
}

// openAgent joins node and returns a connection presenting its
// certificate, on which one call has been answered (the connection's check
// is made and kept), and its identity.
func openAgent(t *testing.T, a *benchAuthority, node string) (*grpc.ClientConn, *identity.Identity) {
	t.Helper()
	id := a.joinedIdentity(t, node)
	conn := a.dial(id)
	for range 2 {
		if _, err := musterv1.NewAgentServiceClient(conn).GetVerifierSet(t.Context(), &musterv1.GetVerifierSetRequest{}); err != nil {
			t.Fatalf("%s: a call before the change: %v", node, err)
		}
	}
	return conn, id
}

func verifierSet(ctx context.Context, conn *grpc.ClientConn) error {
	_, err := musterv1.NewAgentServiceClient(conn).GetVerifierSet(ctx, &musterv1.GetVerifierSetRequest{})
	return err
}

// TestOpenConnectionStandingPerCall: a lock, the node's deletion and a
// superseded instance refuse the very next call on a connection already
// open, whose client-certificate check is kept.
func TestOpenConnectionStandingPerCall(t *testing.T) {
	t.Parallel()
	a := startBench(t)
	ctx := t.Context()
	locked, _ := openAgent(t, a, "conn-locked")
	deleted, _ := openAgent(t, a, "conn-deleted")
	renewed, _ := openAgent(t, a, "conn-renewed")
	if err := a.store.InsertLock(ctx, store.Lock{ID: "l-conn", Kind: store.LockNode, Target: "conn-locked", Reason: "r",
		CreatedBy: "admin", CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	if err := verifierSet(ctx, locked); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the next call after a lock: %v, want PERMISSION_DENIED", err)
	}
	if err := a.store.DeleteNode(ctx, "conn-deleted", setupLink); err != nil {
		t.Fatal(err)
	}
	if err := verifierSet(ctx, deleted); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the next call after the node's deletion: %v, want PERMISSION_DENIED", err)
	}
	// The node joins again, with a token bound to it: a new instance
	// supersedes the one whose certificate the connection presents.
	tok, _ := jointoken.Generate()
	sealer, _ := a.sk.Sealer(seal.InfoToken)
	ct, nonce, _ := sealer.Seal(tok.Secret(), []byte(tok.ID))
	if err := a.store.InsertToken(ctx, store.Token{ID: tok.ID, JoinMethod: store.JoinMethodToken, Ciphertext: ct, Nonce: nonce,
		NodeID: "conn-renewed", CreatedBy: "test", CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	_, der := benchCSR(t)
	if _, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: tok.Reveal(), NodeId: "conn-renewed", Csr: der}); err != nil {
		t.Fatal(err)
	}
	if err := verifierSet(ctx, renewed); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "superseded") {
		t.Errorf("the next call with the superseded certificate: %v, want PERMISSION_DENIED (superseded)", err)
	}
}

// TestOpenConnectionRetiredIntermediate: once the intermediate an open
// connection's chain goes through is retired, the next call on it is
// refused, though the chain was verified on that connection before.
func TestOpenConnectionRetiredIntermediate(t *testing.T) {
	t.Parallel()
	a := startBench(t)
	s := a.srvs[0]
	ctx := t.Context()
	conn, _ := openAgent(t, a, "conn-retired")
	next, err := s.inter.prepare(ctx, ca.RoleAgent, a.h.RootKey, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.store.ActivateCACert(ctx, string(ca.RoleAgent), next.Serial, setupLink); err != nil {
		t.Fatal(err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := verifierSet(ctx, conn); err != nil {
		t.Fatalf("a call while its intermediate is retiring: %v", err)
	}
	if _, err := a.store.RetireCACert(ctx, string(ca.RoleAgent), a.h.Issuers[ca.RoleAgent].Cert.SerialNumber.Text(16), setupLink); err != nil {
		t.Fatal(err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := verifierSet(ctx, conn); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "not issued by this authority") {
		t.Fatalf("the next call after its intermediate's retirement: %v, want UNAUTHENTICATED (not issued by this authority)", err)
	}
}

// TestOpenConnectionRootDropped: once a root rotation reaches standby, the
// old root is no longer trusted, and the next call on a connection open
// since before, whose chain goes through it, is refused.
func TestOpenConnectionRootDropped(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, fastCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	conn, _ := openAgent(t, a, "conn-root")
	if _, err := s.rotateRoot(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, _, err := s.stepRoot(ctx, "t", rootNext); err != nil {
			t.Fatal(err)
		}
		if err := s.inter.load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := verifierSet(ctx, conn); err != nil {
		t.Fatalf("a call in update_servers, the old root still trusted: %v", err)
	}
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	op, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAdmin, "op")
	opLeaf, err := s.ca.Issuer(ca.RoleAdmin).Issue(ca.LeafRequest{PublicKey: k.Public(), SPIFFEID: op.URL(), CommonName: "op",
		ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, st, err := s.stepRoot(ctx, "t", rootNext, opLeaf); err != nil || st.Phase != store.RootPhaseStandby {
		t.Fatalf("to standby: %v %v", st.Phase, err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := verifierSet(ctx, conn); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the next call after its root was dropped: %v, want UNAUTHENTICATED", err)
	}
}

// TestOpenConnectionExpired: a certificate that expires while its
// connection is open is refused, with the expired reason, on the next call.
func TestOpenConnectionExpired(t *testing.T) {
	t.Parallel()
	a := startBench(t)
	ctx := t.Context()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAgent, "conn-expiring")
	leaf, err := a.h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: k.Public(), SPIFFEID: id.URL(), CommonName: "conn-expiring",
		ClientAuth: true, NotBefore: time.Now(), TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	conn := a.dial(&identity.Identity{Chain: []*x509.Certificate{leaf, a.h.Issuer(ca.RoleAgent).Cert}, Key: k, Roots: []*x509.Certificate{a.h.Root}})
	health := healthpb.NewHealthClient(conn)
	for range 2 {
		if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("a call while the certificate is valid: %v", err)
		}
	}
	time.Sleep(time.Until(leaf.NotAfter) + 1100*time.Millisecond)
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("the next call after the certificate's not-after: %v, want UNAUTHENTICATED (expired)", err)
	}
}
