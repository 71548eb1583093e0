package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func pemCount(t *testing.T, path string) []*x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.ParseCertsPEM(data)
	if err != nil {
		t.Fatal(err)
	}
	return certs
}

// newCrossRoot is a new hierarchy, as a root rotation makes, and a
// cross-certificate of its root's key signed by f's root: how an
// authority vouches for a new root to agents that trust the old one.
func newCrossRoot(t *testing.T, f *fakeAuthority) (*ca.Hierarchy, *x509.Certificate) {
	t.Helper()
	next, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tmpl := *next.Root
	tmpl.Raw, tmpl.RawTBSCertificate, tmpl.RawSubjectPublicKeyInfo = nil, nil, nil
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, f.h.Root, next.Root.PublicKey, f.h.RootKey)
	if err != nil {
		t.Fatal(err)
	}
	cross, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return next, cross
}

// trustFilesKept records ca.crt and bundle.pem now; the function it
// returns fails the test if either changed since (op names what ran).
func trustFilesKept(t *testing.T, dir Dir) func(op string) {
	t.Helper()
	caBefore, _ := os.ReadFile(dir.CAFile())
	bundleBefore, _ := os.ReadFile(dir.BundleFile())
	return func(op string) {
		t.Helper()
		if caAfter, _ := os.ReadFile(dir.CAFile()); !bytes.Equal(caBefore, caAfter) {
			t.Fatalf("%s wrote ca.crt", op)
		}
		if bundleAfter, _ := os.ReadFile(dir.BundleFile()); !bytes.Equal(bundleBefore, bundleAfter) {
			t.Fatalf("%s wrote bundle.pem", op)
		}
	}
}

// TestJoinWritesTheTrustBundle: a join writes certs/ca.crt (the root) and
// certs/bundle.pem (the root and the four intermediates), records the
// bundle's digest, and the heartbeat reports both.
func TestJoinWritesTheTrustBundle(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	if roots := pemCount(t, dir.CAFile()); len(roots) != 1 || !roots[0].Equal(f.h.Root) {
		t.Fatalf("ca.crt holds %d certificates, want the root", len(roots))
	}
	if b := pemCount(t, dir.BundleFile()); len(b) != 5 || !b[0].Equal(f.h.Root) {
		t.Fatalf("bundle.pem holds %d certificates, want the root and 4 intermediates", len(b))
	}
	st, _ := dir.ReadState()
	pb := f.trustBundle()
	want, _ := trustbundle.ParseDER(pb.AuthorityId, pb.Roots, pb.Intermediates, pb.CrossCertificates)
	if st.TrustBundle != want.Digest() {
		t.Fatalf("state.json trust_bundle %q, want %q", st.TrustBundle, want.Digest())
	}
	hb := a.heartbeat(t.Context())
	if hb.GetTrustBundleDigest() != want.Digest() || len(hb.GetTrustBundleCerts()) != 5 ||
		hb.GetTrustBundleCerts()[0] != trustbundle.CertFingerprint(f.h.Root) {
		t.Fatalf("heartbeat reports %q %q", hb.GetTrustBundleDigest(), hb.GetTrustBundleCerts())
	}
}

// TestRenewTakesANewRootOnlyThroughACrossCertificate: a renewal answer
// whose bundle names another root does not make the agent trust it; with a
// cross-certificate of that root's key signed by the trusted root it does:
// ca.crt holds both, bundle.pem the new root's intermediate, and the
// keystore's chain both roots.
func TestRenewTakesANewRootOnlyThroughACrossCertificate(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	next, cross := newCrossRoot(t, f)
	f.mu.Lock()
	f.extraBundle = trustbundle.Set{Roots: []*x509.Certificate{next.Root}, Intermediates: []*x509.Certificate{next.Issuers[ca.RoleAgent].Cert}}
	f.mu.Unlock()
	caBefore, _ := os.ReadFile(dir.CAFile())
	if _, err := a.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	if caAfter, _ := os.ReadFile(dir.CAFile()); !bytes.Equal(caBefore, caAfter) {
		t.Fatal("a root offered without a cross-certificate changed ca.crt")
	}
	if b := pemCount(t, dir.BundleFile()); len(b) != 5 {
		t.Fatalf("bundle.pem holds %d certificates: took what does not chain to a trusted root", len(b))
	}

	f.mu.Lock()
	f.extraBundle.Cross = []*x509.Certificate{cross}
	f.mu.Unlock()
	if _, err := a.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	roots := pemCount(t, dir.CAFile())
	if len(roots) != 2 || !roots[0].Equal(f.h.Root) || !roots[1].Equal(next.Root) {
		t.Fatalf("ca.crt holds %d roots, want the old and the cross-certified new", len(roots))
	}
	if b := pemCount(t, dir.BundleFile()); len(b) != 8 {
		t.Fatalf("bundle.pem holds %d certificates, want 2 roots, 5 intermediates, 1 cross-certificate", len(b))
	}
	pass, _ := os.ReadFile(dir.PKCS12PasswordFile())
	p12, _ := os.ReadFile(dir.PKCS12File())
	_, _, chain, err := pkcs12.DecodeChain(p12, string(pass))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range chain {
		found = found || c.Equal(next.Root)
	}
	if !found {
		t.Fatal("the keystore's chain lacks the new root")
	}

	// The authority drops the old root: kept while the certificate, which
	// chains to it, is valid.
	f.mu.Lock()
	f.extraBundle = trustbundle.Set{}
	f.mu.Unlock()
	st, _ := dir.ReadState()
	id, err := dir.LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	pb := f.trustBundle()
	pb.Roots = [][]byte{next.Root.Raw}
	roots2, err := a.takeBundle(st, id, pb)
	if err != nil {
		t.Fatal(err)
	}
	if len(roots2) != 2 {
		t.Fatalf("%d roots after a bundle without the root the current certificate chains to, want it kept", len(roots2))
	}
}

// TestRenewWritesTheBundleOnlyAfterTheCertificateVerifies: a renewal
// answer whose certificate does not verify (another key certified) leaves
// ca.crt and bundle.pem as they were, although its bundle carries a new
// root through a valid cross-certificate; the next, good answer takes it.
func TestRenewWritesTheBundleOnlyAfterTheCertificateVerifies(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	next, cross := newCrossRoot(t, f)
	f.mu.Lock()
	f.extraBundle = trustbundle.Set{Roots: []*x509.Certificate{next.Root}, Cross: []*x509.Certificate{cross}}
	f.wrongKey = true
	f.mu.Unlock()
	kept := trustFilesKept(t, dir)
	if _, err := a.Renew(t.Context()); err == nil {
		t.Fatal("a renewal answered with another key's certificate succeeded")
	}
	kept("a renewal whose certificate did not verify")
	f.mu.Lock()
	f.wrongKey = false
	f.mu.Unlock()
	if _, err := a.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	if roots := pemCount(t, dir.CAFile()); len(roots) != 2 {
		t.Fatalf("ca.crt holds %d roots after a good renewal, want the old and the cross-certified new", len(roots))
	}
}

// TestRenewFromAnUntrustedAuthorityNamesTheWayOut: an agent whose ca.crt
// holds only a root the authority no longer chains to (a root rotation
// finished while it was stopped) is refused the connection, and the
// error, still transient so the agent keeps trying, names the join
// over its identity that brings it back.
func TestRenewFromAnUntrustedAuthorityNamesTheWayOut(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	other, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir.CAFile(), ca.EncodeCertPEM(other.Root), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = a.Renew(t.Context())
	if err == nil {
		t.Fatal("a renewal from an authority that does not chain to ca.crt succeeded")
	}
	for _, want := range []string{"does not chain to the roots in " + dir.CAFile(), "muster agent join --force --data " + string(dir) + " --node n1", "docs/ca-lifecycle.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
	if !Transient(err) {
		t.Errorf("the error is no longer retried: %v", err)
	}
}

// TestNoEmptyHeartbeat: an agent that cannot read its state (here its
// directory's lock is held and the stream is ending) sends no heartbeat,
// rather than an empty one that the authority would keep in place of the
// last (no identity, no verifier set, no budget).
func TestNoEmptyHeartbeat(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	unlock, err := dir.lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	sent := 0
	if err := a.sendHeartbeat(ctx, func(*musterv1.AgentMessage) error { sent++; return nil }); err != nil {
		t.Fatal(err)
	}
	unlock()
	if sent != 0 {
		t.Fatalf("sent %d heartbeats without the agent's state, want none", sent)
	}
	if err := a.sendHeartbeat(t.Context(), func(m *musterv1.AgentMessage) error {
		sent++
		if m.GetHeartbeat().GetIdentityNotAfter() == nil {
			t.Errorf("heartbeat without the identity's end: %v", m)
		}
		return nil
	}); err != nil || sent != 1 {
		t.Fatalf("with the state readable: %d sent, %v", sent, err)
	}
}
