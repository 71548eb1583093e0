package authority

import (
	"context"
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestTrustBundleNeverServesExpired: once an intermediate's NotAfter has
// passed by the replica's clock, no answer carries it and open streams are
// sent the bundle without it, although the CA clock (which would retire
// it at its next step, seconds later) has not run. At its NotAfter itself
// it is still valid, and still served.
func TestTrustBundleNeverServesExpired(t *testing.T) {
	var at atomic.Pointer[time.Time]
	clock := func() time.Time {
		if p := at.Load(); p != nil {
			return *p
		}
		return time.Now()
	}
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) { c.Clock = clock })
	s := a.srvs[0]
	ctx := t.Context()

	key, csr := benchCSR(t)
	resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: a.token, NodeId: "holder", Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	chain, _ := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
	id := &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}
	want, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAuthority, a.info.AuthorityID)
	conn, err := grpc.NewClient(a.conn.Target(), grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, a.h.RootPool(), identity.MatchID(want)))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := musterv1.NewAgentServiceClient(conn).Connect(sctx)
	if err != nil {
		t.Fatal(err)
	}
	bundles := make(chan *musterv1.TrustBundle, 8)
	go func() {
		defer close(bundles)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if b := m.GetTrustBundle(); b != nil {
				bundles <- b
			}
		}
	}()
	next := func(what string) trustbundle.Set {
		t.Helper()
		select {
		case b, ok := <-bundles:
			if !ok {
				t.Fatalf("stream ended waiting for %s", what)
			}
			return parseBundle(t, b)
		case <-time.After(20 * time.Second):
			t.Fatalf("no trust bundle within 20 s: %s", what)
		}
		return trustbundle.Set{}
	}
	next("at open")

	// A successor that lives an hour: the first certificate of the
	// bundle to expire.
	row, err := s.inter.prepare(ctx, ca.RoleAgent, a.h.RootKey, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	short := mustParse(t, row.CertDER)
	holds := func(set trustbundle.Set) bool {
		for _, c := range set.Intermediates {
			if c.Equal(short) {
				return true
			}
		}
		return false
	}
	if got := next("after the successor was prepared"); len(got.Intermediates) != 5 || !holds(got) {
		t.Fatalf("pushed bundle holds %d intermediates, want the 4 and the prepared one", len(got.Intermediates))
	}

	notAfter := short.NotAfter
	at.Store(&notAfter)
	if got := parseBundle(t, s.trustBundleProto()); !holds(got) {
		t.Fatal("at its NotAfter, still valid, the successor is not served")
	}

	later := notAfter.Add(time.Second)
	at.Store(&later)
	// Open streams are sent the bundle without it (the replica's own
	// check, every few seconds), with no answer asking first.
	pushed := next("after the successor expired")
	if holds(pushed) || len(pushed.Intermediates) != 4 || len(pushed.Roots) != 1 {
		t.Fatalf("bundle pushed after the expiry: %d roots, %d intermediates (the expired one: %v), want the root and the 4 valid ones",
			len(pushed.Roots), len(pushed.Intermediates), holds(pushed))
	}
	for _, b := range []struct {
		what string
		pb   *musterv1.TrustBundle
	}{
		{"served", s.trustBundleProto()},
		{"renewal answer", renewBundle(t, conn)},
	} {
		got := parseBundle(t, b.pb)
		for _, c := range got.All() {
			if later.After(c.NotAfter) {
				t.Errorf("%s bundle holds %s, expired at %s", b.what, c.Subject, c.NotAfter)
			}
		}
		if got.Digest() != pushed.Digest() {
			t.Errorf("%s bundle %s, the pushed one %s", b.what, got.Digest(), pushed.Digest())
		}
	}
}

func renewBundle(t *testing.T, conn *grpc.ClientConn) *musterv1.TrustBundle {
	t.Helper()
	_, csr := benchCSR(t)
	r, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(t.Context(), &musterv1.RequestCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetTrustBundle()
}
