package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

// certParts is a certificate's outer structure (RFC 5280, 4.1).
type certParts struct {
	TBS asn1.RawValue
	Alg pkix.AlgorithmIdentifier
	Sig asn1.BitString
}

func splitCert(t testing.TB, der []byte) certParts {
	t.Helper()
	var p certParts
	if rest, err := asn1.Unmarshal(der, &p); err != nil || len(rest) != 0 {
		t.Fatalf("not a certificate (%v, %d bytes after it): %x", err, len(rest), der)
	}
	return p
}

// checkLeafDER holds leafDER to x509.CreateCertificate for l: where
// leafDER encodes, the TBSCertificate is the same bytes, the certificate
// around it is the DER of (TBSCertificate, the algorithm, the signature),
// the signature verifies under parent, and it parses where
// CreateCertificate's does; where it does not encode, it says so with
// errNotEncoded and nothing else.
func checkLeafDER(t testing.TB, l *leafFields, serial *big.Int, parent *x509.Certificate, key crypto.Signer) (encoded bool) {
	t.Helper()
	der, err := leafDER(l, serial, parent, key)
	if errors.Is(err, errNotEncoded) {
		return false
	}
	oracle, werr := x509.CreateCertificate(rand.Reader, l.template(serial), parent, l.pub, key)
	if err != nil {
		t.Fatalf("leafDER: %v (CreateCertificate: %v)", err, werr)
	}
	if werr != nil {
		t.Fatalf("leafDER encoded a leaf CreateCertificate refuses: %v", werr)
	}
	got, want := splitCert(t, der), splitCert(t, oracle)
	if !bytes.Equal(got.TBS.FullBytes, want.TBS.FullBytes) {
		t.Fatalf("TBSCertificate differs from CreateCertificate's:\n got %x\nwant %x", got.TBS.FullBytes, want.TBS.FullBytes)
	}
	outer, err := asn1.Marshal(certParts{asn1.RawValue{FullBytes: got.TBS.FullBytes}, want.Alg, got.Sig})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(der, outer) {
		t.Fatalf("certificate is not the DER of its parts:\n got %x\nwant %x", der, outer)
	}
	if err := parent.CheckSignature(x509.ECDSAWithSHA256, got.TBS.FullBytes, got.Sig.Bytes); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if _, err := x509.ParseCertificate(oracle); err == nil {
		if _, err := x509.ParseCertificate(der); err != nil {
			t.Fatalf("leafDER's certificate does not parse: %v", err)
		}
	}
	return true
}

// TestLeafDERIsCreateCertificate: every kind of leaf muster issues, and
// the edges of each field's encoding (lengths past 127 and 255 bytes,
// serials with the top bit set, UTCTime and GeneralizedTime, names equal to
// the issuer's, issuers with and without a key ID), encoded by leafDER as
// x509.CreateCertificate encodes them; what leafDER does not encode
// (another key type, a non-printable name) is left to CreateCertificate.
func TestLeafDERIsCreateCertificate(t *testing.T) {
	h := hierarchy(t)
	agent := h.Issuer(RoleAgent)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)

	// An issuer whose subject is a bare common name and that has no key
	// ID, so a leaf may carry its very names (no authority key ID then).
	bareKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	bareDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(7),
		Subject: pkix.Name{CommonName: "same"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)},
		&x509.Certificate{Subject: pkix.Name{CommonName: "other"}}, bareKey.Public(), bareKey)
	if err != nil {
		t.Fatal(err)
	}
	bare, _ := x509.ParseCertificate(bareDER)
	if len(bare.SubjectKeyId) != 0 {
		t.Fatal("the bare issuer has a key ID")
	}

	id, _ := url.Parse("spiffe://example.test/agent/node-1")
	longID, _ := url.Parse("spiffe://example.test/agent/" + strings.Repeat("n", 300))
	now := time.Now()
	zone := time.FixedZone("east", 5*3600+1800)
	serials := []*big.Int{big.NewInt(1), big.NewInt(127), big.NewInt(128), big.NewInt(255), big.NewInt(256),
		new(big.Int).Lsh(big.NewInt(1), 127), new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 128), big.NewInt(1)),
		new(big.Int).Lsh(big.NewInt(1), 159)}
	base := leafFields{pub: p256.Public(), commonName: "node-1", uri: id, notBefore: now.Add(-Backdate),
		notAfter: now.Add(24 * time.Hour), clientAuth: true}
	cases := map[string]func(l *leafFields){
		"agent":                 func(*leafFields) {},
		"agent serving TLS":     func(l *leafFields) { l.serverAuth = true },
		"server only":           func(l *leafFields) { l.serverAuth, l.clientAuth = true, false },
		"no extended usage":     func(l *leafFields) { l.clientAuth = false },
		"ed25519 key":           func(l *leafFields) { l.pub = edPub },
		"no common name":        func(l *leafFields) { l.commonName = "" },
		"no names at all":       func(l *leafFields) { l.commonName, l.uri = "", nil },
		"no SAN":                func(l *leafFields) { l.uri = nil },
		"long common name":      func(l *leafFields) { l.commonName = strings.Repeat("a", 200) },
		"printable punctuation": func(l *leafFields) { l.commonName = "A z'()+,-./:=?9" },
		"long URI":              func(l *leafFields) { l.uri = longID },
		"server names": func(l *leafFields) {
			l.dnsNames = []string{"authority.example", "localhost"}
			l.ips = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.IPv4(10, 0, 0, 1).To4(), net.ParseIP("2001:db8::7")}
		},
		"many names (lengths past 65535)": func(l *leafFields) {
			for i := range 3000 {
				l.dnsNames = append(l.dnsNames, fmt.Sprintf("host-%04d.%s.example", i, strings.Repeat("x", 10)))
			}
		},
		"one CRL distribution point": func(l *leafFields) { l.crlDPs = []string{"http://crl.example:7445/crl/agent-1.crl"} },
		"two CRL distribution points": func(l *leafFields) {
			l.crlDPs = []string{"http://a.example/crl/agent-1.crl", "http://b.example/" + strings.Repeat("c", 200)}
		},
		"times in another zone":            func(l *leafFields) { l.notBefore, l.notAfter = now.In(zone), now.Add(time.Hour).In(zone) },
		"UTCTime's first year":             func(l *leafFields) { l.notBefore = time.Date(1950, 1, 1, 0, 0, 0, 0, time.UTC) },
		"before UTCTime":                   func(l *leafFields) { l.notBefore = time.Date(1949, 12, 31, 23, 59, 59, 999, time.UTC) },
		"UTCTime's last second":            func(l *leafFields) { l.notAfter = time.Date(2049, 12, 31, 23, 59, 59, 0, time.UTC) },
		"GeneralizedTime":                  func(l *leafFields) { l.notAfter = time.Date(2050, 1, 1, 0, 0, 0, 0, time.UTC) },
		"year 9999":                        func(l *leafFields) { l.notAfter = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC) },
		"year 10000 (not encoded)":         func(l *leafFields) { l.notAfter = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
		"P-384 key (not encoded)":          func(l *leafFields) { l.pub = p384.Public() },
		"UTF-8 name (not encoded)":         func(l *leafFields) { l.commonName = "nœud" },
		"asterisk (not encoded)":           func(l *leafFields) { l.commonName = "*.example" },
		"non-ASCII DNS name (not encoded)": func(l *leafFields) { l.dnsNames = []string{"é.example"} },
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			l := base
			change(&l)
			encoded := checkLeafDER(t, &l, serials[6], agent.Cert, agent.Key)
			if encoded == strings.HasSuffix(name, "(not encoded)") {
				t.Errorf("encoded = %v", encoded)
			}
		})
	}
	for _, s := range serials {
		l := base
		if !checkLeafDER(t, &l, s, agent.Cert, agent.Key) {
			t.Errorf("serial %x not encoded", s)
		}
	}
	for _, cn := range []string{"same", "node-1", ""} {
		l := base
		l.commonName = cn
		if !checkLeafDER(t, &l, serials[0], bare, bareKey) {
			t.Errorf("%q under the bare issuer not encoded", cn)
		}
	}
	// Every byte in a common name, alone and among letters.
	for b := range 256 {
		for _, cn := range []string{string(rune(b)), "ab" + string([]byte{byte(b)}) + "cd"} {
			l := base
			l.commonName = cn
			checkLeafDER(t, &l, serials[1], agent.Cert, agent.Key)
		}
	}
}

// TestLeafDERRefusesWhatCreateCertificateRefuses: a key that is not the
// issuer certificate's, and a signer whose signature does not verify.
func TestLeafDERRefusesWhatCreateCertificateRefuses(t *testing.T) {
	h := hierarchy(t)
	agent := h.Issuer(RoleAgent)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	l := leafFields{pub: key.Public(), commonName: "n", notBefore: time.Now(), notAfter: time.Now().Add(time.Hour), clientAuth: true}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if _, err := leafDER(&l, big.NewInt(1), agent.Cert, other); err == nil || errors.Is(err, errNotEncoded) {
		t.Errorf("another key: %v", err)
	}
	if _, err := leafDER(&l, big.NewInt(1), agent.Cert, faultySigner{agent.Key}); err == nil || errors.Is(err, errNotEncoded) {
		t.Errorf("a faulty signer: %v", err)
	}
	if _, err := (&Issuer{Cert: agent.Cert, Key: faultySigner{agent.Key}}).Issue(LeafRequest{PublicKey: key.Public(),
		CommonName: "n", ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour}); err == nil {
		t.Error("Issue with a faulty signer succeeded")
	}
}

// faultySigner signs, then flips a bit of the signature's last byte.
type faultySigner struct{ crypto.Signer }

func (f faultySigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := f.Signer.Sign(r, digest, opts)
	if err == nil {
		sig[len(sig)-1] ^= 1
	}
	return sig, err
}

// TestIssueAllocations: an agent leaf's issuance, its signature and the
// parse of what was signed included, stays far below the ~330 allocations
// it took through encoding/asn1.
func TestIssueAllocations(t *testing.T) {
	h := hierarchy(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id, _ := url.Parse("spiffe://td/agent/node-1")
	agent := *h.Issuer(RoleAgent) // a copy: the hierarchy is shared
	agent.CRLDistributionPoints = []string{"http://crl.example/crl/agent.crl"}
	n := testing.AllocsPerRun(20, func() {
		if _, err := agent.Issue(LeafRequest{PublicKey: key.Public(), SPIFFEID: id, CommonName: "node-1",
			ClientAuth: true, NotBefore: time.Now(), TTL: 24 * time.Hour}); err != nil {
			t.Fatal(err)
		}
	})
	if n > 150 {
		t.Errorf("Issue: %.0f allocations, want at most 150", n)
	}
}

// FuzzLeafDER holds leafDER to x509.CreateCertificate as the oracle.
func FuzzLeafDER(f *testing.F) {
	h := hierarchy(f)
	agent := h.Issuer(RoleAgent)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	f.Add("node-1", "spiffe://td/agent/node-1", "", []byte{}, int64(1_800_000_000), int64(86400), true, false, "", []byte{1})
	f.Add("", "", "a.example", []byte{127, 0, 0, 1}, int64(-700_000_000), int64(1<<40), false, true, "http://c/x.crl", []byte{0x80, 0})
	f.Fuzz(func(t *testing.T, cn, uri, dns string, ip []byte, nb, ttl int64, server, client bool, crl string, serial []byte) {
		l := leafFields{pub: key.Public(), commonName: cn, notBefore: time.Unix(nb, 0), notAfter: time.Unix(nb, 0).Add(time.Duration(ttl) * time.Second),
			serverAuth: server, clientAuth: client}
		if uri != "" {
			u, err := url.Parse(uri)
			if err != nil {
				return
			}
			l.uri = u
		}
		if dns != "" {
			l.dnsNames = []string{dns}
		}
		switch len(ip) {
		case 0:
		case net.IPv4len, net.IPv6len:
			l.ips = []net.IP{ip}
		default:
			return // CreateCertificate writes it, and nothing parses it
		}
		if crl != "" {
			l.crlDPs = []string{crl}
		}
		s := new(big.Int).SetBytes(serial)
		if s.Sign() == 0 {
			return
		}
		checkLeafDER(t, &l, s, agent.Cert, agent.Key)
	})
}

// TestNewSerial: serials are positive, at most 128 bits, not repeated,
// and cost two allocations (three under the race detector; rand.Int took
// five).
func TestNewSerial(t *testing.T) {
	seen := map[string]bool{}
	long := 0
	for range 1000 {
		s, err := NewSerial()
		if err != nil {
			t.Fatal(err)
		}
		if s.Sign() <= 0 || s.BitLen() > 128 {
			t.Fatalf("serial %x: want positive and at most 128 bits", s)
		}
		if s.BitLen() > 120 {
			long++
		}
		if seen[s.String()] {
			t.Fatalf("serial %x repeated", s)
		}
		seen[s.String()] = true
	}
	if long < 900 {
		t.Errorf("%d of 1000 serials longer than 120 bits: not uniform over 128", long)
	}
	if n := testing.AllocsPerRun(100, func() { NewSerial() }); n > 3 {
		t.Errorf("NewSerial: %.0f allocations, want at most 3", n)
	}
}
