package authority

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// TestConnClassAfterRotation: after the agent and admin intermediates
// rotate, leaves of the retiring ones still count as their agent and as
// an operator, not anonymous.
func TestConnClassAfterRotation(t *testing.T) {
	a := startReplicas(t, nil, 1)
	ctx := t.Context()
	s := a.srvs[0]
	leaf := func(role ca.Role, idRole spiffeid.Role, name string) []*x509.Certificate {
		t.Helper()
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		id, err := spiffeid.New(a.info.TrustDomain, idRole, name)
		if err != nil {
			t.Fatal(err)
		}
		iss := a.h.Issuers[role]
		c, err := iss.Issue(ca.LeafRequest{PublicKey: &key.PublicKey, SPIFFEID: id.URL(), ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{c, iss.Cert}
	}
	agentLeaf := leaf(ca.RoleAgent, spiffeid.RoleAgent, "n1")
	adminLeaf := leaf(ca.RoleAdmin, spiffeid.RoleAdmin, "alice")
	if op, ag := s.connClass(nil, agentLeaf); op || ag != "n1" {
		t.Fatalf("before the rotation: agent leaf classed %v %q", op, ag)
	}
	for _, role := range []ca.Role{ca.RoleAgent, ca.RoleAdmin} {
		row, err := s.inter.prepare(ctx, role, a.h.RootKey, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.store.ActivateCACert(ctx, string(role), row.Serial, setupLink); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); bytes.Equal(s.ca.Issuer(ca.RoleAgent).Cert.Raw, a.h.Issuers[ca.RoleAgent].Cert.Raw) ||
		bytes.Equal(s.ca.Issuer(ca.RoleAdmin).Cert.Raw, a.h.Issuers[ca.RoleAdmin].Cert.Raw); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not take up the new intermediates within 10 s")
		}
	}
	if op, ag := s.connClass(nil, agentLeaf); op || ag != "n1" {
		t.Errorf("a leaf of the retiring agent intermediate classed operator=%v agent=%q, want agent n1", op, ag)
	}
	if op, ag := s.connClass(nil, adminLeaf); !op || ag != "" {
		t.Errorf("a leaf of the retiring admin intermediate classed operator=%v agent=%q, want operator", op, ag)
	}
}

// deadlineConn records the deadlines set on it.
type deadlineConn struct {
	net.Conn
	set []time.Time
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	c.set = append(c.set, t)
	return nil
}

// stalledCreds is a TLS handshake that never completes.
type stalledCreds struct {
	credentials.TransportCredentials
}

func (stalledCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("stalled")
}

// TestReserveHandshakeDeadline: a handshake that starts while as many as
// the anonymous share of the cap are under way gets reserveHandshake, not
// gRPC's handshakeTimeout; one below keeps gRPC's; a handshake that ended
// leaves the count.
func TestReserveHandshakeDeadline(t *testing.T) {
	s := &Server{shares: newConnShares(8)} // anonymous share: 6
	creds := sharedCreds{TransportCredentials: stalledCreds{}, s: s}
	below := &deadlineConn{}
	creds.ServerHandshake(below)
	if len(below.set) != 0 {
		t.Fatalf("a handshake below the share had its deadline set: %v", below.set)
	}
	s.shares.handshaking.Store(6)
	reserve := &deadlineConn{}
	start := time.Now()
	creds.ServerHandshake(reserve)
	if len(reserve.set) != 1 || reserve.set[0].Sub(start) > reserveHandshake+time.Second || reserve.set[0].Before(start) {
		t.Fatalf("a handshake in the reserve: deadlines %v, want one about %s from %s", reserve.set, reserveHandshake, start)
	}
	if n := s.shares.handshaking.Load(); n != 6 {
		t.Fatalf("%d handshakes counted after two ended, want the 6 left", n)
	}
}
