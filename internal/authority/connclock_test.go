package authority

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
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
