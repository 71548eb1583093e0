package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// RegisterUsingBoundKeypair is enough of the bound-keypair stream for a
// refresh: one challenge (its answer is not checked), then a certificate
// from f.leafIssuer (else h's agent intermediate) and the trust bundle.
func (f *fakeAuthority) RegisterUsingBoundKeypair(stream musterv1.JoinService_RegisterUsingBoundKeypairServer) error {
	msg, err := stream.Recv()
	if err != nil {
		return err
	}
	init := msg.GetInit()
	f.mu.Lock()
	if len(f.boundErrs) > 0 {
		err := f.boundErrs[0]
		f.boundErrs = f.boundErrs[1:]
		f.mu.Unlock()
		return err
	}
	f.mu.Unlock()
	ch, err := boundkeypair.NewChallenge(f.aid, time.Now())
	if err != nil {
		return err
	}
	if err := stream.Send(&musterv1.RegisterUsingBoundKeypairResponse{Payload: &musterv1.RegisterUsingBoundKeypairResponse_Challenge{Challenge: ch.Marshal()}}); err != nil {
		return err
	}
	if _, err := stream.Recv(); err != nil {
		return err
	}
	csr, err := ca.ParseCSR(init.GetCsr())
	if err != nil {
		return status.Error(codes.InvalidArgument, "csr")
	}
	f.mu.Lock()
	iss, wrong := f.leafIssuer, f.wrongKey
	instance := "instance-1"
	if f.boundInstance != nil {
		instance = *f.boundInstance
	}
	f.mu.Unlock()
	if iss == nil {
		iss = f.h.Issuer(ca.RoleAgent)
	}
	pub := csr.PublicKey
	if wrong {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		pub = k.Public()
	}
	aid, _ := spiffeid.New(f.trustDomain(), spiffeid.RoleAgent, init.GetNodeId())
	leaf, err := iss.Issue(ca.LeafRequest{PublicKey: pub, SPIFFEID: aid.URL(), CommonName: init.GetNodeId(), ClientAuth: true,
		NotBefore: time.Now(), TTL: f.ttl})
	if err != nil {
		return err
	}
	return stream.Send(&musterv1.RegisterUsingBoundKeypairResponse{Payload: &musterv1.RegisterUsingBoundKeypairResponse_Result{Result: &musterv1.BoundKeypairResult{
		CertificateChainPem: string(iss.ChainPEM(leaf)), InstanceId: instance, Generation: 1, AuthorityId: f.aid,
		TrustDomain: f.trustDomain(), JoinState: init.GetPreviousJoinState(), TrustBundle: f.trustBundle()}}})
}

// boundJoined is an agent joined by token whose state then records a
// bound-keypair token, with its bound key: what a refresh needs.
func boundJoined(t *testing.T, f *fakeAuthority) (*Agent, Dir) {
	t.Helper()
	a, dir := joined(t, f)
	if _, err := CreateBoundKey(dir); err != nil {
		t.Fatal(err)
	}
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	st.JoinMethod, st.BoundKeypair = JoinMethodBoundKeypair, "bk"
	if err := dir.writeState(st); err != nil {
		t.Fatal(err)
	}
	return a, dir
}

// boundUnderNewRoot is a bound-keypair agent whose authority answers its
// refresh with a leaf under a new root (a root rotation's update_servers),
// and a bundle carrying that root through a cross-certificate signed by
// the root the agent trusts.
func boundUnderNewRoot(t *testing.T) (*Agent, Dir, *ca.Hierarchy) {
	t.Helper()
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := boundJoined(t, f)
	next, cross := newCrossRoot(t, f)
	f.mu.Lock()
	f.leafIssuer = next.Issuer(ca.RoleAgent)
	f.extraBundle = trustbundle.Set{Roots: []*x509.Certificate{next.Root}, Intermediates: []*x509.Certificate{next.Issuer(ca.RoleAgent).Cert},
		Cross: []*x509.Certificate{cross}}
	f.mu.Unlock()
	return a, dir, next
}

// TestRefreshTakesTheBundleBeforeVerifyingAndWritesAfter: a bound-keypair
// refresh answered, as in a root rotation's update_servers, with a leaf
// under a new root the agent does not trust yet, and a bundle that
// carries that root through a cross-certificate signed by the root it
// trusts: the leaf verifies against the roots trusted after the bundle
// (ca.crt holds both). Answered with a certificate of another key, the
// refresh fails and leaves ca.crt and bundle.pem as they were, although
// the bundle would have been taken.
func TestRefreshTakesTheBundleBeforeVerifyingAndWritesAfter(t *testing.T) {
	t.Run("leaf under the new root", func(t *testing.T) {
		a, dir, next := boundUnderNewRoot(t)
		st, err := a.Rebind(t.Context())
		if err != nil {
			t.Fatalf("refresh answered with a leaf under the cross-certified new root: %v", err)
		}
		if roots := pemCount(t, dir.CAFile()); len(roots) != 2 || !roots[1].Equal(next.Root) {
			t.Fatalf("ca.crt holds %d roots, want the old and the new", len(roots))
		}
		id, err := dir.LoadIdentity()
		if err != nil {
			t.Fatal(err)
		}
		if serialOf(id.Leaf()) != st.Serial || id.Leaf().CheckSignatureFrom(next.Issuer(ca.RoleAgent).Cert) != nil {
			t.Fatal("the identity on disk is not the new leaf")
		}
	})

	t.Run("certificate that does not verify", func(t *testing.T) {
		f := newFakeAuthority(t, fakeOptions{})
		a, dir := boundJoined(t, f)
		next, cross := newCrossRoot(t, f)
		f.mu.Lock()
		f.wrongKey = true
		f.extraBundle = trustbundle.Set{Roots: []*x509.Certificate{next.Root}, Cross: []*x509.Certificate{cross}}
		f.mu.Unlock()
		kept := trustFilesKept(t, dir)
		if _, err := a.Rebind(t.Context()); err == nil {
			t.Fatal("a refresh answered with another key's certificate succeeded")
		}
		kept("a refresh whose certificate did not verify")
	})
}

// TestRefreshCrashBetweenBundleAndIdentity: a bound-keypair refresh
// answered with a leaf under a new root (a root rotation's
// update_servers) and stopped between its trust bundle and its identity,
// as a crash there would, leaves a certificate that verifies against the
// roots on disk, an identity that loads, and a refresh that then
// succeeds. Before, the identity was written first: the new leaf beside
// a ca.crt without its root.
func TestRefreshCrashBetweenBundleAndIdentity(t *testing.T) {
	a, dir, _ := boundUnderNewRoot(t)

	func() {
		prev := renewStep
		defer func() {
			renewStep = prev
			if p := recover(); p != errCrash("bundle") {
				t.Fatalf("the refresh did not stop between the bundle and the identity: %v", p)
			}
		}()
		renewStep = func(s string) {
			if s == "bundle" {
				panic(errCrash(s))
			}
		}
		a.Rebind(t.Context())
	}()

	id, err := dir.LoadIdentity()
	if err != nil {
		t.Fatalf("the identity after the crash does not load: %v", err)
	}
	roots := x509.NewCertPool()
	for _, r := range pemCount(t, dir.CAFile()) {
		roots.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range id.Chain[1:] {
		inter.AddCert(c)
	}
	if _, err := id.Leaf().Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("after the crash %s does not verify against %s: %v", dir.CertFile(), dir.CAFile(), err)
	}
	st, err := newTestAgent(t, dir).Rebind(t.Context())
	if err != nil {
		t.Fatalf("refresh after the crash: %v", err)
	}
	if id, err = dir.LoadIdentity(); err != nil || serialOf(id.Leaf()) != st.Serial {
		t.Fatalf("the identity after the refresh that followed the crash: %v", err)
	}
}
