package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	testHierOnce sync.Once
	testHier     *Hierarchy
)

func hierarchy(t testing.TB) *Hierarchy {
	t.Helper()
	testHierOnce.Do(func() {
		h, err := Create("test", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		testHier = h
	})
	return testHier
}

func TestCreate(t *testing.T) {
	now := time.Now()
	h, err := Create("prod", now)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Root.IsCA || h.Root.MaxPathLen != 1 || h.Root.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("root: IsCA %v MaxPathLen %d usage %v", h.Root.IsCA, h.Root.MaxPathLen, h.Root.KeyUsage)
	}
	if got := h.Root.NotAfter.Sub(now); got < RootTTL-time.Second || got > RootTTL {
		t.Errorf("root lifetime %v", got)
	}
	roots := h.RootPool()
	for _, tc := range []struct {
		role  Role
		usage x509.ExtKeyUsage
		wrong x509.ExtKeyUsage
		ttl   time.Duration
	}{
		{RoleBootstrap, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, IntermediateTTL},
		{RoleServer, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, IntermediateTTL},
		// The agent intermediate allows both: a --svid-usage client,server
		// SVID verifies as a TLS server certificate in OpenSSL (which checks
		// EKUs down the chain). No wrong purpose to try (ExtKeyUsageAny).
		{RoleAgent, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageAny, IntermediateTTL},
		{RoleAgent, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageAny, IntermediateTTL},
		{RoleAdmin, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth, IntermediateTTL},
	} {
		t.Run(string(tc.role), func(t *testing.T) {
			c := h.Issuer(tc.role).Cert
			if !c.IsCA || c.MaxPathLen != 0 || !c.MaxPathLenZero {
				t.Errorf("IsCA %v MaxPathLen %d zero %v", c.IsCA, c.MaxPathLen, c.MaxPathLenZero)
			}
			if got := c.NotAfter.Sub(now); got < tc.ttl-time.Second || got > tc.ttl {
				t.Errorf("lifetime %v, want %v", got, tc.ttl)
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
				t.Errorf("does not verify: %v", err)
			}
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			inter := x509.NewCertPool()
			inter.AddCert(c)
			// A leaf for the intermediate's purpose verifies for it.
			ok, err := h.Issuer(tc.role).Issue(LeafRequest{PublicKey: key.Public(), NotBefore: now, TTL: time.Hour,
				ServerAuth: tc.usage == x509.ExtKeyUsageServerAuth, ClientAuth: tc.usage == x509.ExtKeyUsageClientAuth})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ok.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
				t.Errorf("a leaf for %v does not verify under the %s intermediate: %v", tc.usage, tc.role, err)
			}
			if tc.wrong == x509.ExtKeyUsageAny {
				return
			}
			// A leaf issued for the wrong purpose under this intermediate
			// must not verify for that purpose.
			key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			leaf, err := h.Issuer(tc.role).Issue(LeafRequest{PublicKey: key.Public(), NotBefore: now, TTL: time.Hour,
				ServerAuth: tc.wrong == x509.ExtKeyUsageServerAuth, ClientAuth: tc.wrong == x509.ExtKeyUsageClientAuth})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{tc.wrong}}); err == nil {
				t.Errorf("a leaf for %v verified under the %s intermediate", tc.wrong, tc.role)
			}
		})
	}
	pol := h.Issuer(RolePolicy).Cert
	if pol.IsCA || pol.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("policy certificate: IsCA %v usage %v", pol.IsCA, pol.KeyUsage)
	}
	if _, err := pol.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("policy certificate does not verify: %v", err)
	}
	if _, err := h.Issuer(RolePolicy).Issue(LeafRequest{PublicKey: pol.PublicKey, NotBefore: now, TTL: time.Hour, ClientAuth: true}); err == nil {
		t.Error("the policy certificate issued a certificate")
	}
	if _, err := Create("Bad_Name", now); err == nil {
		t.Error("Create accepted an invalid name")
	}
}

func TestFingerprint(t *testing.T) {
	h := hierarchy(t)
	sum := sha256.Sum256(h.Root.RawSubjectPublicKeyInfo)
	want := "sha256:" + hex.EncodeToString(sum[:])
	if h.Fingerprint() != want {
		t.Fatalf("Fingerprint = %s, want %s", h.Fingerprint(), want)
	}
	if !MatchesFingerprint(h.Root, "sha256:"+strings.ToUpper(want[7:])) {
		t.Error("upper-case hex not accepted")
	}
	if MatchesFingerprint(h.Issuer(RoleServer).Cert, want) {
		t.Error("another certificate matched the root pin")
	}
	// Re-issuing the root with the same key keeps the pin.
	tmpl := *h.Root
	reissued, err := sign(&tmpl, h.RootKey.Public(), &tmpl, h.RootKey)
	if err != nil {
		t.Fatal(err)
	}
	if Fingerprint(reissued) != want || bytes.Equal(reissued.Raw, h.Root.Raw) {
		t.Error("re-issued root lost its pin")
	}
	if got := AuthorityID("prod", want); got != "prod-"+want[7:13] {
		t.Errorf("AuthorityID = %s", got)
	}
	for _, bad := range []string{"", "sha256:", want[:70], "sha1:" + want[7:], "sha256:" + strings.Repeat("g", 64)} {
		if _, err := ParseFingerprint(bad); err == nil {
			t.Errorf("ParseFingerprint(%q) accepted", bad)
		}
	}
}

func TestIssue(t *testing.T) {
	h := hierarchy(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now().Truncate(time.Second)
	id, _ := url.Parse("spiffe://td/agent/node-1")
	leaf, err := h.Issuer(RoleAgent).Issue(LeafRequest{PublicKey: key.Public(), SPIFFEID: id, CommonName: "node-1",
		ClientAuth: true, NotBefore: now, TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.NotBefore.Equal(now.Add(-Backdate)) || !leaf.NotAfter.Equal(now.Add(24*time.Hour)) {
		t.Errorf("validity %v..%v", leaf.NotBefore, leaf.NotAfter)
	}
	if leaf.IsCA || len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() || leaf.Subject.CommonName != "node-1" {
		t.Errorf("leaf fields: CA %v URIs %v CN %q", leaf.IsCA, leaf.URIs, leaf.Subject.CommonName)
	}
	if len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("EKU %v", leaf.ExtKeyUsage)
	}
	chain, err := ParseCertsPEM(h.Issuer(RoleAgent).ChainPEM(leaf))
	if err != nil || len(chain) != 2 || !chain[1].Equal(h.Issuer(RoleAgent).Cert) {
		t.Fatalf("ChainPEM: %v %v", len(chain), err)
	}

	long, err := h.Issuer(RoleAgent).Issue(LeafRequest{PublicKey: key.Public(), ClientAuth: true, NotBefore: now, TTL: 5 * RootTTL})
	if err != nil || !long.NotAfter.Equal(h.Issuer(RoleAgent).Cert.NotAfter) {
		t.Errorf("leaf outlives its issuer: %v %v", long.NotAfter, err)
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	for name, req := range map[string]LeafRequest{
		"zero ttl":  {PublicKey: key.Public(), ClientAuth: true, NotBefore: now},
		"no usage":  {PublicKey: key.Public(), NotBefore: now, TTL: time.Hour},
		"P-384 key": {PublicKey: p384.Public(), ClientAuth: true, NotBefore: now, TTL: time.Hour},
	} {
		if _, err := h.Issuer(RoleAgent).Issue(req); err == nil {
			t.Errorf("%s: issued", name)
		}
	}
}

func csrDER(t testing.TB, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "ignored"}, DNSNames: []string{"evil.example"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestParseCSR(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	good := csrDER(t, p256)
	tampered := bytes.Clone(good)
	tampered[len(tampered)-5] ^= 0xff
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"P-256 DER", good, nil},
		{"P-256 PEM", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: good}), nil},
		{"Ed25519", csrDER(t, edKey), nil},
		{"P-384", csrDER(t, p384), ErrKeyType},
		{"RSA", csrDER(t, rsaKey), ErrKeyType},
		{"bad signature", tampered, ErrBadCSR},
		{"empty", nil, ErrBadCSR},
		{"garbage", []byte("hello"), ErrBadCSR},
		{"wrong PEM type", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: good}), ErrBadCSR},
		{"too large", append(bytes.Clone(good), make([]byte, MaxCSRSize)...), ErrBadCSR},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCSR(tt.in)
			if !errors.Is(err, tt.want) {
				t.Fatalf("ParseCSR = %v, want %v", err, tt.want)
			}
		})
	}
}

func FuzzParseCSR(f *testing.F) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	f.Add(csrDER(f, p256))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		csr, err := ParseCSR(data)
		if err != nil {
			if !errors.Is(err, ErrBadCSR) && !errors.Is(err, ErrKeyType) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if AllowedPublicKey(csr.PublicKey) != nil || csr.CheckSignature() != nil {
			t.Fatal("accepted a CSR with a bad key or signature")
		}
	})
}

func TestWriteLoad(t *testing.T) {
	h := hierarchy(t)
	dir := filepath.Join(t.TempDir(), "ca")
	if err := h.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Root.Equal(h.Root) || !got.RootKey.Equal(h.RootKey) {
		t.Error("root changed")
	}
	for _, r := range Roles {
		if !got.Issuer(r).Cert.Equal(h.Issuer(r).Cert) {
			t.Errorf("%s changed", r)
		}
		fi, _ := os.Stat(filepath.Join(dir, string(r)+".key"))
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s.key mode %v", r, fi.Mode().Perm())
		}
	}
	if err := h.WriteDir(dir); err == nil {
		t.Error("WriteDir overwrote an existing hierarchy")
	}

	// Without the root key the hierarchy still loads: it can stay offline.
	os.Remove(filepath.Join(dir, "root.key"))
	if got, err := Load(dir); err != nil || got.RootKey != nil {
		t.Errorf("Load without root.key: %v", err)
	}

	// An intermediate whose key is in a token has only its certificate
	// here; the policy signing key must be a file.
	os.Remove(filepath.Join(dir, "agent.key"))
	if got, err := Load(dir); err != nil || got.Issuers[RoleAgent].Key != nil || !got.Issuers[RoleAgent].Cert.Equal(h.Issuer(RoleAgent).Cert) {
		t.Errorf("Load without agent.key: %v", err)
	}
	os.Remove(filepath.Join(dir, "policy.key"))
	if _, err := Load(dir); err == nil {
		t.Error("Load without policy.key succeeded")
	}
}

// A key held elsewhere (a token's signer) gets no file; its certificate does.
func TestWriteDirSkipsKeysHeldElsewhere(t *testing.T) {
	shared := hierarchy(t)
	h := &Hierarchy{Root: shared.Root, RootKey: shared.RootKey, Issuers: map[Role]*Issuer{}}
	for r, i := range shared.Issuers {
		h.Issuers[r] = i
	}
	h.Issuers[RoleServer] = &Issuer{Cert: shared.Issuers[RoleServer].Cert, Key: heldElsewhere{shared.Issuers[RoleServer].Key}}
	dir := filepath.Join(t.TempDir(), "ca")
	if err := h.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "server.key")); err == nil {
		t.Error("a key held elsewhere was written to a file")
	}
	if _, err := os.Stat(filepath.Join(dir, "server.crt")); err != nil {
		t.Error(err)
	}
}

type heldElsewhere struct{ crypto.Signer }

func TestLoadRefusals(t *testing.T) {
	h := hierarchy(t)
	other, _ := Create("other", time.Now())
	copyFile := func(from, to string) {
		data, _ := os.ReadFile(from)
		os.Remove(to)
		os.WriteFile(to, data, 0o600)
	}
	tests := []struct {
		name   string
		break_ func(dir, otherDir string)
		want   string
	}{
		{"missing intermediate", func(d, _ string) { os.Remove(filepath.Join(d, "agent.crt")) }, "no such file"},
		{"key readable by others", func(d, _ string) { os.Chmod(filepath.Join(d, "server.key"), 0o644) }, "accessible by other users"},
		{"key of another hierarchy", func(d, o string) { copyFile(filepath.Join(o, "admin.key"), filepath.Join(d, "admin.key")) }, "does not match"},
		{"intermediate of another root", func(d, o string) {
			copyFile(filepath.Join(o, "agent.crt"), filepath.Join(d, "agent.crt"))
			copyFile(filepath.Join(o, "agent.key"), filepath.Join(d, "agent.key"))
		}, "not signed by"},
		{"corrupt root", func(d, _ string) { os.WriteFile(filepath.Join(d, "root.crt"), []byte("junk"), 0o644) }, "no certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			dir, odir := filepath.Join(base, "ca"), filepath.Join(base, "other")
			h.WriteDir(dir)
			other.WriteDir(odir)
			tt.break_(dir, odir)
			_, err := Load(dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load = %v, want %q", err, tt.want)
			}
		})
	}
}

// BenchmarkIssue measures the pure crypto of one agent issuance: checking a
// CSR's signature once and signing the certificate. Service benchmarks
// report their cost as a ratio to this.
func BenchmarkIssue(b *testing.B) {
	h := hierarchy(b)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der := csrDER(b, key)
	id, _ := url.Parse("spiffe://td/agent/node-1")
	b.ReportAllocs()
	for b.Loop() {
		csr, err := ParseCSR(der)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := h.Issuer(RoleAgent).Issue(LeafRequest{PublicKey: csr.PublicKey, SPIFFEID: id, CommonName: "node-1",
			ClientAuth: true, NotBefore: time.Now(), TTL: 24 * time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestIssueNamesCRLDistributionPoints: an issuer with distribution points
// names them in every leaf; one without names none.
func TestIssueNamesCRLDistributionPoints(t *testing.T) {
	h, err := Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	issue := func(i *Issuer) *x509.Certificate {
		c, err := i.Issue(LeafRequest{PublicKey: key.Public(), CommonName: "n", ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if got := issue(h.Issuer(RoleAgent)).CRLDistributionPoints; len(got) != 0 {
		t.Errorf("without distribution points: %v", got)
	}
	h.Issuer(RoleAgent).CRLDistributionPoints = []string{"http://crl.example:7445/crl/agent-1.crl"}
	if got := issue(h.Issuer(RoleAgent)).CRLDistributionPoints; len(got) != 1 || got[0] != "http://crl.example:7445/crl/agent-1.crl" {
		t.Errorf("with a distribution point: %v", got)
	}
}

// TestIssueRefusesAfterTheIssuerExpired: an intermediate past its
// not-after issues nothing (a leaf of it would be expired already), and
// says what to do.
func TestIssueRefusesAfterTheIssuerExpired(t *testing.T) {
	h := hierarchy(t)
	serial, _ := NewSerial()
	ikey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now().Truncate(time.Second)
	cert, err := h.NewIntermediate(RoleAgent, serial, ikey.Public(), h.RootKey, now.Add(-2*time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired := &Issuer{Cert: cert, Key: ikey}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, at := range []time.Time{now, cert.NotAfter} {
		leaf, err := expired.Issue(LeafRequest{PublicKey: key.Public(), ClientAuth: true, NotBefore: at, TTL: time.Hour})
		if err == nil {
			t.Fatalf("issued at %v by an intermediate expired at %v: valid %v..%v", at, cert.NotAfter, leaf.NotBefore, leaf.NotAfter)
		}
		if !strings.Contains(err.Error(), "expired") || !strings.Contains(err.Error(), "root key") || !strings.Contains(err.Error(), "docs/ca-lifecycle.md") {
			t.Errorf("the refusal names no way out: %v", err)
		}
	}
	if _, err := expired.Issue(LeafRequest{PublicKey: key.Public(), ClientAuth: true, NotBefore: cert.NotAfter.Add(-time.Second), TTL: time.Hour}); err != nil {
		t.Errorf("a second before its expiry: %v", err)
	}
}

// TestSignMatchesParsed holds Sign's fields to what ParseCertificate reads
// from its DER, the fields a join or renewal records unparsed: validity in
// UTC and whole seconds whatever the request's zone and fraction, the
// clipped end, the serial.
func TestSignMatchesParsed(t *testing.T) {
	h := hierarchy(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	east := time.FixedZone("east", 5*3600+30*60)
	base := time.Now()
	for name, req := range map[string]LeafRequest{
		"fraction, local zone":               {NotBefore: base, TTL: time.Hour},
		"fraction near a second, other zone": {NotBefore: time.Date(2026, 11, 27, 23, 59, 59, 999_999_999, east), TTL: 90*time.Minute + 999*time.Millisecond},
		"whole seconds, UTC":                 {NotBefore: base.UTC().Truncate(time.Second), TTL: 24 * time.Hour},
		"clipped to the issuer":              {NotBefore: base.In(east), TTL: 5 * RootTTL},
	} {
		t.Run(name, func(t *testing.T) {
			req.PublicKey, req.ClientAuth = key.Public(), true
			signed, err := h.Issuer(RoleAgent).Sign(req)
			if err != nil {
				t.Fatal(err)
			}
			parsed, err := x509.ParseCertificate(signed.Raw)
			if err != nil {
				t.Fatal(err)
			}
			got := Signed{Raw: parsed.Raw, SerialNumber: parsed.SerialNumber, NotBefore: parsed.NotBefore, NotAfter: parsed.NotAfter}
			if !reflect.DeepEqual(signed, got) {
				t.Errorf("Sign: serial %v, %v..%v; parsed: serial %v, %v..%v", signed.SerialNumber, signed.NotBefore, signed.NotAfter,
					got.SerialNumber, got.NotBefore, got.NotAfter)
			}
		})
	}
}

// BenchmarkIssueParsed: a leaf signed and parsed back (Issue), and
// signed alone (Sign), as a join or renewal takes it.
func BenchmarkIssueParsed(b *testing.B) {
	h := hierarchy(b)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id, _ := url.Parse("spiffe://td/agent/node-1")
	req := LeafRequest{PublicKey: key.Public(), SPIFFEID: id, CommonName: "node-1", ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour}
	b.Run("parsed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.Issuer(RoleAgent).Issue(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("signed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.Issuer(RoleAgent).Sign(req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
