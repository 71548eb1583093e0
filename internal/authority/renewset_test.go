package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestRenewalCarriesSetSteppedElsewherePostgres: a renewal's answer
// carries the verifier set of the ID its one read took along
// (store.RenewalRead), so a signer step made through the other replica is
// in the very next renewal's answer, as when the answer read the ID
// itself.
func TestRenewalCarriesSetSteppedElsewherePostgres(t *testing.T) {
	benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
	pgtest.FailOrSkip(t, benchPGErr)
	url := benchPG.NewDatabase(t)
	a := startReplicas(t, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, url) }, 2)
	ctx := t.Context()
	key, csr := benchCSR(t)
	resp, err := musterv1.NewBootstrapServiceClient(a.conns[0]).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: a.token, NodeId: "renewer", Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAuthority, a.info.AuthorityID)
	// renew renews the holder of chainPEM and key over a connection of
	// its own, returning the answer and the new key.
	renew := func(chainPEM string, key *ecdsa.PrivateKey) (*musterv1.RequestCertificateResponse, *ecdsa.PrivateKey) {
		t.Helper()
		chain, _ := ca.ParseCertsPEM([]byte(chainPEM))
		id := &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}
		conn, err := grpc.NewClient(a.conns[0].Target(), grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, a.h.RootPool(), identity.MatchID(want)))))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		next, csr := benchCSR(t)
		r, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: csr})
		if err != nil {
			t.Fatal(err)
		}
		return r, next
	}
	versionOf := func(raw []byte) int64 {
		t.Helper()
		vs, err := signer.NewTrust(raw, nil)
		if err != nil {
			t.Fatalf("verifier set in the answer: %v", err)
		}
		return vs.Version()
	}
	r, key := renew(resp.GetCertificateChainPem(), key)
	before := versionOf(r.GetVerifierSet())

	// Stepped through the other replica: this one learns of it only from
	// the store.
	res, err := a.srvs[1].signers.Stage(ctx, signer.Actor{Name: "test"}, time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if res.Version <= before {
		t.Fatalf("Stage made version %d, the renewal answered %d", res.Version, before)
	}
	r, _ = renew(r.GetCertificateChainPem(), key)
	if got := versionOf(r.GetVerifierSet()); got != res.Version {
		t.Fatalf("the renewal after the step carries version %d, want %d", got, res.Version)
	}
}
