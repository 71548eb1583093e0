package ca

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"net"
	"net/url"
	"reflect"
	"slices"
	"testing"
	"time"
)

// TestLeafTemplateMatchesPlain: a leaf signed with its fixed extensions
// given encoded (Sign) says what one from the plain template says, for
// every role that issues leaves, every usage and key type, with and
// without a CRL distribution point: the same extensions (each with its
// criticality and value; their order is free, RFC 5280 4.2), so the same
// SPIFFE ID, names, key usages, basic constraints, authority key ID and
// distribution point, subject, issuer and validity; and it verifies
// under the root for each usage it carries.
func TestLeafTemplateMatchesPlain(t *testing.T) {
	h := hierarchy(t)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	id, _ := url.Parse("spiffe://td/agent/node-1")
	now := time.Now()
	for _, role := range []Role{RoleAgent, RoleServer, RoleAdmin} {
		for _, crlDP := range [][]string{nil, {"http://crl.example:7445/crl/" + string(role) + "-1.crl"}} {
			issuer := &Issuer{Cert: h.Issuers[role].Cert, Key: h.Issuers[role].Key, CRLDistributionPoints: crlDP}
			for _, req := range []LeafRequest{
				{PublicKey: ecKey.Public(), SPIFFEID: id, CommonName: "node-1", ClientAuth: true},
				{PublicKey: edPub, SPIFFEID: id, CommonName: "node-1", ClientAuth: true, ServerAuth: true},
				{PublicKey: ecKey.Public(), SPIFFEID: id, CommonName: "a1-abcdef", ServerAuth: true,
					DNSNames: []string{"authority.example", "localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}},
				{PublicKey: ecKey.Public(), CommonName: "", ClientAuth: true, DNSNames: []string{"n.example"}},
			} {
				req.NotBefore, req.TTL = now, time.Hour
				name := string(role) + "/" + req.CommonName
				if len(crlDP) > 0 {
					name += "/crl"
				}
				if req.ServerAuth {
					name += "/server"
				}
				if req.ClientAuth {
					name += "/client"
				}
				t.Run(name, func(t *testing.T) {
					tmpl := issuer.leafTemplate(req, new(templateBuf))
					if len(tmpl.ExtraExtensions) == 0 {
						t.Fatal("the leaf's template gives x509 no extension encoded")
					}
					signed, err := issuer.Sign(req)
					if err != nil {
						t.Fatal(err)
					}
					got, err := x509.ParseCertificate(signed.Raw)
					if err != nil {
						t.Fatal(err)
					}
					plainSigned, err := signDER(issuer.plainLeafTemplate(req, new(templateBuf)), req.PublicKey, issuer.Cert, issuer.Key)
					if err != nil {
						t.Fatal(err)
					}
					want, err := x509.ParseCertificate(plainSigned.Raw)
					if err != nil {
						t.Fatal(err)
					}
					sameLeaf(t, got, want)
					// Leaves of server and bootstrap intermediates verify for
					// server auth only, the admin one's for client auth only:
					// each leaf is verified for the usages it carries that its
					// issuer allows (a usage it does not allow is refused by
					// any verifier, as for the plain leaf).
					for _, usage := range got.ExtKeyUsage {
						if !slices.Contains(issuer.Cert.ExtKeyUsage, usage) {
							continue
						}
						for _, c := range []*x509.Certificate{got, want} {
							if _, err := c.Verify(x509.VerifyOptions{Roots: h.RootPool(), Intermediates: pool(issuer.Cert),
								CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
								t.Errorf("usage %v: %v", usage, err)
							}
						}
					}
				})
			}
		}
	}
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// sameLeaf fails t unless got and want say the same, their serials,
// signatures and the order of their extensions aside.
func sameLeaf(t *testing.T, got, want *x509.Certificate) {
	t.Helper()
	type ext struct {
		critical bool
		value    string
	}
	exts := func(c *x509.Certificate) map[string]ext {
		m := map[string]ext{}
		for _, e := range c.Extensions {
			if _, dup := m[e.Id.String()]; dup {
				t.Errorf("extension %v twice", e.Id)
			}
			m[e.Id.String()] = ext{e.Critical, string(e.Value)}
		}
		return m
	}
	if g, w := exts(got), exts(want); !reflect.DeepEqual(g, w) {
		t.Errorf("extensions:\n got %v\nwant %v", g, w)
	}
	if len(got.Extensions) != len(want.Extensions) {
		t.Errorf("%d extensions, want %d", len(got.Extensions), len(want.Extensions))
	}
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"URIs", got.URIs, want.URIs},
		{"DNSNames", got.DNSNames, want.DNSNames},
		{"IPAddresses", got.IPAddresses, want.IPAddresses},
		{"KeyUsage", got.KeyUsage, want.KeyUsage},
		{"ExtKeyUsage", got.ExtKeyUsage, want.ExtKeyUsage},
		{"BasicConstraintsValid", got.BasicConstraintsValid, want.BasicConstraintsValid},
		{"IsCA", got.IsCA, want.IsCA},
		{"AuthorityKeyId", got.AuthorityKeyId, want.AuthorityKeyId},
		{"SubjectKeyId", got.SubjectKeyId, want.SubjectKeyId},
		{"CRLDistributionPoints", got.CRLDistributionPoints, want.CRLDistributionPoints},
		{"RawSubject", got.RawSubject, want.RawSubject},
		{"RawIssuer", got.RawIssuer, want.RawIssuer},
		{"RawSubjectPublicKeyInfo", got.RawSubjectPublicKeyInfo, want.RawSubjectPublicKeyInfo},
		{"NotBefore", got.NotBefore, want.NotBefore},
		{"NotAfter", got.NotAfter, want.NotAfter},
		{"SignatureAlgorithm", got.SignatureAlgorithm, want.SignatureAlgorithm},
		{"Version", got.Version, want.Version},
	} {
		if !reflect.DeepEqual(f.got, f.want) {
			t.Errorf("%s: got %v, want %v", f.name, f.got, f.want)
		}
	}
	if len(got.AuthorityKeyId) == 0 {
		t.Error("no authority key ID")
	}
}

// BenchmarkBuildLeafExtensions: what an issuer pays once (and again
// after the authority reloads its intermediates, every caRefresh) to
// have its leaves' fixed extensions encoded.
func BenchmarkBuildLeafExtensions(b *testing.B) {
	h := hierarchy(b)
	dp := []string{"http://crl.example:7445/crl/agent-1.crl"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := buildLeafExtensions(h.Issuers[RoleAgent].Cert, dp); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLeafExtensionsKeptAcrossIssuers: an Issuer made anew for the same
// certificate (the authority's reload of its intermediates, every few
// seconds) takes the extensions already made, not a millisecond's
// making of its own; another distribution point or certificate gets its
// own.
func TestLeafExtensionsKeptAcrossIssuers(t *testing.T) {
	h := hierarchy(t)
	cert := h.Issuers[RoleAgent].Cert
	reparsed, err := x509.ParseCertificate(cert.Raw)
	if err != nil {
		t.Fatal(err)
	}
	dp := []string{"http://crl.example:7445/crl/agent-kept.crl"}
	first := (&Issuer{Cert: cert, CRLDistributionPoints: dp}).fixedExtensions()
	again := (&Issuer{Cert: reparsed, CRLDistributionPoints: slices.Clone(dp)}).fixedExtensions()
	if first == nil || again == nil {
		t.Fatal("no extensions made")
	}
	for u := range first.byUsage {
		if &first.byUsage[u][0] != &again.byUsage[u][0] {
			t.Errorf("usage %d: made again for the same certificate", u)
		}
	}
	for name, other := range map[string]*Issuer{
		"another distribution point": {Cert: cert, CRLDistributionPoints: []string{"http://crl.example:7445/crl/agent-other.crl"}},
		"another certificate":        {Cert: h.Issuers[RoleServer].Cert, CRLDistributionPoints: dp},
	} {
		if fx := other.fixedExtensions(); fx == nil || &fx.byUsage[0][0] == &first.byUsage[0][0] {
			t.Errorf("%s: took the first issuer's extensions", name)
		}
	}
}
