package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestConnCheckUsesTheReplicaClock: a connection's client certificate is
// checked at the replica's clock (Config.Clock), the one that dates its
// trust bundle and rotations, not the wall clock: an agent certificate
// valid now but expired at the replica's time is anonymous for the
// connection's share, refused on its calls, and recorded as expired.
func TestConnCheckUsesTheReplicaClock(t *testing.T) {
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) { c.Clock = later })
	s := a.srvs[0]
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id, err := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAgent, "n1")
	if err != nil {
		t.Fatal(err)
	}
	iss := a.h.Issuers[ca.RoleAgent]
	leaf, err := iss.Issue(ca.LeafRequest{PublicKey: &key.PublicKey, SPIFFEID: id.URL(), ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	certs := []*x509.Certificate{leaf, iss.Cert}
	if op, ag := s.connClass(&connChain{}, certs); op || ag != "" {
		t.Errorf("a certificate expired at the replica's clock classed operator=%v agent=%q, want anonymous", op, ag)
	}
	ctx := peer.NewContext(t.Context(), &peer.Peer{Addr: &net.TCPAddr{}, AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: certs}}})
	if chain, err := s.clientChain(ctx); err == nil {
		t.Errorf("a certificate expired at the replica's clock verified: chain of %d", len(chain))
	}
	if got, want := s.claimedActor(ctx), actorExpired+id.String(); got != want {
		t.Errorf("claimedActor = %q, want %q", got, want)
	}
}

// TestConnPastItsShareIsToldWhy: an agent's connection past its share
// (connsPerAgent open) reaches its client as RESOURCE_EXHAUSTED naming
// the cap and the way out, not as a connection closed before gRPC's
// preface ("error reading server preface: EOF").
func TestConnPastItsShareIsToldWhy(t *testing.T) {
	a := startReplicas(t, nil, 1)
	key, csr := benchCSR(t)
	resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(t.Context(),
		&musterv1.ExchangeJoinTokenRequest{JoinToken: a.token, NodeId: "crowded", Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	chain, _ := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
	id := &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	call := func() error {
		conn := a.dial(id)
		t.Cleanup(func() { conn.Close() })
		_, err := musterv1.NewAgentServiceClient(conn).GetVerifierSet(ctx, &musterv1.GetVerifierSetRequest{})
		return err
	}
	for i := range connsPerAgent {
		if err := call(); err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, connsPerAgent, err)
		}
	}
	err = call()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), fmt.Sprintf("holds %d connections", connsPerAgent)) ||
		!strings.Contains(err.Error(), "crowded") {
		t.Fatalf("connection %d: %v; want RESOURCE_EXHAUSTED naming the cap of %d", connsPerAgent+1, err, connsPerAgent)
	}
}
