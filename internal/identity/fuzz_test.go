package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// FuzzVerifyPeer feeds VerifyPeer what a TLS peer sends: a leaf and an
// intermediate as DER. Whatever it accepts must chain to the pinned root
// and carry the authority's SPIFFE ID; a certificate from another
// hierarchy never passes.
func FuzzVerifyPeer(f *testing.F) {
	h, err := ca.Create("fuzz", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	other, err := ca.Create("other", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	want, _ := spiffeid.New("fuzz-td", spiffeid.RoleAuthority, "fuzz-td")
	issue := func(h *ca.Hierarchy) []byte {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		leaf, err := h.Issuer(ca.RoleServer).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: want.URL(),
			ServerAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			f.Fatal(err)
		}
		return leaf.Raw
	}
	good := issue(h)
	f.Add(good, h.Issuer(ca.RoleServer).Cert.Raw)
	f.Add(issue(other), other.Issuer(ca.RoleServer).Cert.Raw)
	f.Add(h.Root.Raw, []byte{})
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x01}, []byte{})
	roots := x509.NewCertPool()
	roots.AddCert(h.Root)
	leaf, _ := x509.ParseCertificate(good)
	if err := VerifyPeer([]*x509.Certificate{leaf, h.Issuer(ca.RoleServer).Cert}, roots, MatchID(want), x509.ExtKeyUsageServerAuth, time.Now()); err != nil {
		f.Fatalf("the good seed does not verify: %v", err)
	}
	f.Fuzz(func(t *testing.T, leafDER, interDER []byte) {
		var certs []*x509.Certificate
		for _, der := range [][]byte{leafDER, interDER} {
			if len(der) == 0 {
				continue
			}
			c, err := x509.ParseCertificate(der)
			if err != nil {
				return // the TLS stack refuses what does not parse
			}
			certs = append(certs, c)
		}
		if err := VerifyPeer(certs, roots, MatchID(want), x509.ExtKeyUsageServerAuth, time.Now()); err != nil {
			return
		}
		got, err := spiffeid.FromCertificate(certs[0])
		if err != nil || got != want {
			t.Fatalf("accepted a peer with identity %v (%v)", got, err)
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: pool(certs[1:]),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Fatalf("accepted a peer that does not chain to the root: %v", err)
		}
	})
}

func pool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}
