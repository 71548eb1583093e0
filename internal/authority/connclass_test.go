package authority

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

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
	if op, ag := s.connClass(agentLeaf); op || ag != "n1" {
		t.Fatalf("before the rotation: agent leaf classed %v %q", op, ag)
	}
	for _, role := range []ca.Role{ca.RoleAgent, ca.RoleAdmin} {
		row, err := s.inter.prepare(ctx, role, a.h.RootKey, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.store.ActivateCACert(ctx, string(role), row.Serial); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); bytes.Equal(s.ca.Issuer(ca.RoleAgent).Cert.Raw, a.h.Issuers[ca.RoleAgent].Cert.Raw) ||
		bytes.Equal(s.ca.Issuer(ca.RoleAdmin).Cert.Raw, a.h.Issuers[ca.RoleAdmin].Cert.Raw); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not take up the new intermediates within 10 s")
		}
	}
	if op, ag := s.connClass(agentLeaf); op || ag != "n1" {
		t.Errorf("a leaf of the retiring agent intermediate classed operator=%v agent=%q, want agent n1", op, ag)
	}
	if op, ag := s.connClass(adminLeaf); !op || ag != "" {
		t.Errorf("a leaf of the retiring admin intermediate classed operator=%v agent=%q, want operator", op, ag)
	}
}
