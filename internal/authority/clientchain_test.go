package authority

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"net/url"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// fullChain is the check the short path stands in for: the leaf verified
// through the presented intermediates to the root, or, presented alone,
// through the authority's agent and admin intermediates.
func fullChain(h *ca.Hierarchy, certs []*x509.Certificate, now time.Time) ([]*x509.Certificate, error) {
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if len(certs) == 1 {
		inter.AddCert(h.Issuer(ca.RoleAgent).Cert)
		inter.AddCert(h.Issuer(ca.RoleAdmin).Cert)
	}
	chains, err := certs[0].Verify(x509.VerifyOptions{Roots: h.RootPool(), Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, err
	}
	return chains[0], nil
}

// TestClientAnchorsAgreeWithTheFullCheck: the short path accepts only
// chains the full check accepts, with the same leaf and intermediate, and
// it is taken for an agent's and an operator's certificate as presented,
// with its intermediate or alone;
// expired, not yet valid, foreign, wrongly chained or wrong-purpose
// certificates are never accepted by it (they go to the full check, which
// gives the reason).
func TestClientAnchorsAgreeWithTheFullCheck(t *testing.T) {
	start := time.Now().Add(-time.Hour)
	h, err := ca.Create("anchors", start)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Create("anchors", start) // same names, another key
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(h *ca.Hierarchy, role ca.Role, client bool, notBefore time.Time, ttl time.Duration) *x509.Certificate {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		id, _ := url.Parse("spiffe://td/agent/node")
		c, err := h.Issuer(role).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id, CommonName: "node",
			ClientAuth: client, ServerAuth: !client, NotBefore: notBefore, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	now := time.Now()
	agentInter, adminInter := h.Issuer(ca.RoleAgent).Cert, h.Issuer(ca.RoleAdmin).Cert
	agent := leaf(h, ca.RoleAgent, true, now, time.Hour)
	cases := []struct {
		name  string
		certs []*x509.Certificate
		at    time.Time
		short bool // the short path accepts
	}{
		{"agent certificate as presented", []*x509.Certificate{agent, agentInter}, now, true},
		{"operator certificate as presented", []*x509.Certificate{leaf(h, ca.RoleAdmin, true, now, time.Hour), adminInter}, now, true},
		{"agent leaf alone", []*x509.Certificate{agent}, now, true},
		{"operator leaf alone", []*x509.Certificate{leaf(h, ca.RoleAdmin, true, now, time.Hour)}, now, true},
		{"expired leaf alone", []*x509.Certificate{leaf(h, ca.RoleAgent, true, now.Add(-3*time.Hour), time.Hour)}, now, false},
		{"foreign leaf alone, issuer of the same name", []*x509.Certificate{leaf(other, ca.RoleAgent, true, now, time.Hour)}, now, false},
		{"server leaf alone", []*x509.Certificate{leaf(h, ca.RoleServer, false, now, time.Hour)}, now, false},
		{"leaf with the wrong intermediate", []*x509.Certificate{agent, adminInter}, now, false},
		{"leaf, intermediate and root", []*x509.Certificate{agent, agentInter, h.Root}, now, false},
		{"expired leaf", []*x509.Certificate{leaf(h, ca.RoleAgent, true, now.Add(-3*time.Hour), time.Hour), agentInter}, now, false},
		{"leaf not yet valid", []*x509.Certificate{agent, agentInter}, now.Add(-2 * time.Hour), false},
		{"after the intermediate's expiry", []*x509.Certificate{agent, agentInter}, agentInter.NotAfter.Add(time.Minute), false},
		{"server certificate", []*x509.Certificate{leaf(h, ca.RoleServer, false, now, time.Hour), h.Issuer(ca.RoleServer).Cert}, now, false},
		{"foreign leaf presenting our intermediate", []*x509.Certificate{leaf(other, ca.RoleAgent, true, now, time.Hour), agentInter}, now, false},
		{"foreign leaf and intermediate", []*x509.Certificate{leaf(other, ca.RoleAgent, true, now, time.Hour), other.Issuer(ca.RoleAgent).Cert}, now, false},
	}
	var a clientAnchors
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := a.verify(h, c.certs, c.at)
			if ok != c.short {
				t.Fatalf("short path took it: %v, want %v", ok, c.short)
			}
			full, err := fullChain(h, c.certs, c.at)
			if !ok {
				return
			}
			if err != nil {
				t.Fatalf("short path accepted what the full check refuses: %v", err)
			}
			if len(got) != 2 || !bytes.Equal(got[0].Raw, full[0].Raw) || !bytes.Equal(got[1].Raw, full[1].Raw) {
				t.Fatalf("short path chain differs from the full check's")
			}
		})
	}
}

// BenchmarkClientChain: the check authorize makes on every mTLS call, by
// the full path and by the short one, for an agent's certificate as
// presented.
func BenchmarkClientChain(b *testing.B) {
	h, err := ca.Create("anchors", time.Now().Add(-time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id, _ := url.Parse("spiffe://td/agent/node")
	leaf, err := h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id, CommonName: "node",
		ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	certs := []*x509.Certificate{leaf, h.Issuer(ca.RoleAgent).Cert}
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			if _, err := fullChain(h, certs, time.Now()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("short", func(b *testing.B) {
		var a clientAnchors
		for b.Loop() {
			if _, ok := a.verify(h, certs, time.Now()); !ok {
				b.Fatal("short path not taken")
			}
		}
	})
}
