package discovery

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/ca"
)

// hierarchies are made once per test binary: P-256 keys are cheap, but
// the fuzz targets call for them on every run. The first root's authority
// ID has a hex letter (so an upper-case ID differs from it) and the two
// roots' IDs differ.
var hierarchies = sync.OnceValues(func() ([2]*ca.Hierarchy, error) {
	var hs [2]*ca.Hierarchy
	for i := range hs {
		for {
			h, err := ca.Create("prod", time.Now())
			if err != nil {
				return hs, err
			}
			id := ca.AuthorityID("prod", h.Fingerprint())
			if i == 0 && strings.ToUpper(id[len(id)-6:]) == id[len(id)-6:] || i == 1 && id == ca.AuthorityID("prod", hs[0].Fingerprint()) {
				continue
			}
			hs[i] = h
			break
		}
	}
	return hs, nil
})

// testHierarchies returns the hierarchy under test and another one, both
// named "prod".
func testHierarchies(t testing.TB) (h, other *ca.Hierarchy) {
	t.Helper()
	hs, err := hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	return hs[0], hs[1]
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func pemOf(certs ...*x509.Certificate) string {
	var b bytes.Buffer
	for _, c := range certs {
		b.Write(ca.EncodeCertPEM(c))
	}
	return b.String()
}

// validRegistration is h's registration, as an authority sends it.
func validRegistration(t testing.TB, h *ca.Hierarchy) Registration {
	t.Helper()
	pol, err := json.Marshal(DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	return Registration{
		AuthorityID:          ca.AuthorityID("prod", h.Fingerprint()),
		Endpoints:            []string{"authority.example.com:7443", "[2001:db8::1]:7443", "192.0.2.10:443"},
		CABundlePEM:          pemOf(h.Root),
		Policy:               pol,
		Version:              1,
		PolicyCertificatePEM: pemOf(h.Issuer(ca.RolePolicy).Cert),
	}
}

func signRegistration(t testing.TB, r Registration, key crypto.Signer) []byte {
	t.Helper()
	_, sig, err := r.Sign(key)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return sig
}

// rootIssued mints a certificate directly under h's root for a new P-256
// key, from tmpl.
func rootIssued(t testing.TB, h *ca.Hierarchy, tmpl *x509.Certificate, key *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	if key == nil {
		var err error
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	der, err := x509.CreateCertificate(rand.Reader, tmpl, h.Root, key.Public(), h.RootKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRegistrationRoundTrip(t *testing.T) {
	h, _ := testHierarchies(t)
	r := validRegistration(t, h)
	doc, sig, err := r.Sign(h.Issuer(ca.RolePolicy).Key)
	if err != nil {
		t.Fatal(err)
	}
	v, err := r.Verify(sig)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	wantPolicy, err := DefaultPolicy().Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r, v.Registration); diff != "" {
		t.Errorf("registration (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"document", string(v.Document), string(doc)},
		{"fingerprint", v.Fingerprint, h.Fingerprint()},
		{"canonical policy", string(v.CanonicalPolicy), string(wantPolicy)},
		{"root", v.Root.Equal(h.Root), true},
		{"policy certificate", v.PolicyCert.Equal(h.Issuer(ca.RolePolicy).Cert), true},
	} {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
	}
	if diff := cmp.Diff(DefaultPolicy(), v.ParsedPolicy, ignorePolicyInternals); diff != "" {
		t.Errorf("parsed policy (-want +got):\n%s", diff)
	}
	// The document names its type, so it can never pass for a join report.
	if !bytes.HasPrefix(doc, []byte(`{"authority_id":`)) || !bytes.Contains(doc, []byte(`"type":"muster-register-authority"`)) {
		t.Errorf("document %s lacks its type", doc)
	}
}

func TestRegistrationVerifyRefuses(t *testing.T) {
	h, other := testHierarchies(t)
	policyKey := h.Issuer(ca.RolePolicy).Key
	agentKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	agentLeaf, err := h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: agentKey.Public(), CommonName: "node-1",
		ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pol := h.Issuer(ca.RolePolicy).Cert
	noSigKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	noDigitalSignature := rootIssued(t, h, &x509.Certificate{NotBefore: pol.NotBefore, NotAfter: pol.NotAfter,
		KeyUsage: x509.KeyUsageKeyEncipherment, BasicConstraintsValid: true}, noSigKey)
	// The same key under a new certificate: a different document.
	reissued := rootIssued(t, h, &x509.Certificate{Subject: pol.Subject, NotBefore: pol.NotBefore, NotAfter: pol.NotAfter,
		KeyUsage: pol.KeyUsage, BasicConstraintsValid: true}, policyKey.(*ecdsa.PrivateKey))
	report := JoinReport{AuthorityID: ca.AuthorityID("prod", h.Fingerprint()), NodeID: "web-1", InstanceID: "i-1", JoinedAt: time.Now()}
	reportSig, err := report.Sign(policyKey)
	if err != nil {
		t.Fatal(err)
	}
	hex6 := strings.TrimPrefix(h.Fingerprint(), "sha256:")[:6]
	otherHex6 := strings.TrimPrefix(other.Fingerprint(), "sha256:")[:6]

	for _, tc := range []struct {
		name string
		// before changes the registration, which is then signed by key
		// (the policy key if nil); after changes it once signed.
		before  func(r *Registration)
		key     crypto.Signer
		after   func(r *Registration)
		sig     []byte // replaces the signature if set
		wantErr error  // errors.Is, if set
		wantMsg string // otherwise a part of the message
	}{
		{name: "version 0", before: func(r *Registration) { r.Version = 0 }, wantMsg: "version must be between 1"},
		{name: "negative version", before: func(r *Registration) { r.Version = -1 }, wantMsg: "version must be between 1"},
		{name: "version beyond exact integers", before: func(r *Registration) { r.Version = 1<<53 + 1 }, wantMsg: "version must be between 1"},
		{name: "no endpoints", before: func(r *Registration) { r.Endpoints = nil }, wantMsg: "between 1 and 16 endpoints"},
		{name: "17 endpoints", before: func(r *Registration) {
			r.Endpoints = repeat(17, func(i int) string { return fmt.Sprintf("a%d.example.com:7443", i) })
		}, wantMsg: "between 1 and 16 endpoints"},
		{name: "endpoint without port", before: func(r *Registration) { r.Endpoints = []string{"authority.example.com"} }, wantMsg: "is not HOST:PORT"},
		{name: "endpoint without host", before: func(r *Registration) { r.Endpoints = []string{":7443"} }, wantMsg: "is not HOST:PORT"},
		{name: "IPv6 endpoint without brackets", before: func(r *Registration) { r.Endpoints = []string{"2001:db8::1:7443"} }, wantMsg: "is not HOST:PORT"},
		{name: "endpoint too long", before: func(r *Registration) { r.Endpoints = []string{strings.Repeat("a", 300) + ":1"} }, wantMsg: "is not HOST:PORT"},
		{name: "port 0", before: func(r *Registration) { r.Endpoints = []string{"a.example.com:0"} }, wantMsg: "bad port"},
		{name: "port too high", before: func(r *Registration) { r.Endpoints = []string{"a.example.com:65536"} }, wantMsg: "bad port"},
		{name: "port by name", before: func(r *Registration) { r.Endpoints = []string{"a.example.com:https"} }, wantMsg: "bad port"},
		{name: "port with a sign", before: func(r *Registration) { r.Endpoints = []string{"a.example.com:+443"} }, wantMsg: "bad port"},
		{name: "empty port", before: func(r *Registration) { r.Endpoints = []string{"a.example.com:"} }, wantMsg: "bad port"},
		{name: "one bad endpoint among good ones", before: func(r *Registration) { r.Endpoints = append(r.Endpoints, "x") }, wantMsg: `endpoint "x"`},
		{name: "endpoint not UTF-8", before: func(r *Registration) { r.Endpoints = []string{"a\xff.example.com:443"} }, sig: []byte("unused"), wantMsg: "not valid UTF-8"},

		{name: "bundle not PEM", before: func(r *Registration) { r.CABundlePEM = "root" }, wantMsg: "ca_bundle_pem"},
		{name: "bundle too large", before: func(r *Registration) { r.CABundlePEM += strings.Repeat("\n", 64<<10) }, wantMsg: "too large"},
		{name: "bundle starting with the policy certificate", before: func(r *Registration) { r.CABundlePEM = pemOf(pol, h.Root) },
			wantMsg: "not a self-signed CA"},
		{name: "bundle starting with an intermediate", before: func(r *Registration) { r.CABundlePEM = pemOf(h.Issuer(ca.RoleAgent).Cert, h.Root) },
			wantMsg: "not a self-signed CA"},
		{name: "bundle of another root", before: func(r *Registration) { r.CABundlePEM = pemOf(other.Root) }, wantMsg: "does not match its root"},

		{name: "authority ID of another root", before: func(r *Registration) { r.AuthorityID = "prod-" + otherHex6 }, wantMsg: "does not match its root"},
		{name: "authority ID with upper-case hex", before: func(r *Registration) { r.AuthorityID = "prod-A" + hex6[1:] },
			wantMsg: "is not NAME-HEX6"},
		{name: "authority ID without hex", before: func(r *Registration) { r.AuthorityID = "prod" }, wantMsg: "is not NAME-HEX6"},
		{name: "authority ID with a bad name", before: func(r *Registration) { r.AuthorityID = "Prod-" + hex6 }, wantMsg: "is not NAME-HEX6"},
		{name: "empty authority ID", before: func(r *Registration) { r.AuthorityID = "" }, wantMsg: "is not NAME-HEX6"},

		{name: "no policy certificate", before: func(r *Registration) { r.PolicyCertificatePEM = "" }, wantMsg: "want exactly one certificate"},
		{name: "policy certificate with its chain", before: func(r *Registration) { r.PolicyCertificatePEM = pemOf(pol, h.Root) },
			wantMsg: "want exactly one certificate"},
		{name: "policy certificate of another hierarchy", before: func(r *Registration) {
			r.PolicyCertificatePEM = pemOf(other.Issuer(ca.RolePolicy).Cert)
		}, key: other.Issuer(ca.RolePolicy).Key, wantMsg: "not issued by the root"},
		{name: "intermediate as policy certificate", before: func(r *Registration) {
			r.PolicyCertificatePEM = pemOf(h.Issuer(ca.RoleAgent).Cert)
		}, key: h.Issuer(ca.RoleAgent).Key, wantMsg: "not a policy signing certificate"},
		{name: "root as policy certificate", before: func(r *Registration) { r.PolicyCertificatePEM = pemOf(h.Root) }, key: h.RootKey,
			wantMsg: "not a policy signing certificate"},
		{name: "agent leaf as policy certificate", before: func(r *Registration) { r.PolicyCertificatePEM = pemOf(agentLeaf) }, key: agentKey,
			wantMsg: "not issued by the root"},
		{name: "root-issued certificate without the digital-signature usage", before: func(r *Registration) {
			r.PolicyCertificatePEM = pemOf(noDigitalSignature)
		}, key: noSigKey, wantMsg: "lacks the digital-signature usage"},

		{name: "signed by another key", key: other.Issuer(ca.RolePolicy).Key, wantErr: ErrSignature},
		{name: "signed by the agent intermediate", key: h.Issuer(ca.RoleAgent).Key, wantErr: ErrSignature},
		{name: "no signature", sig: []byte{}, wantErr: ErrSignature},
		{name: "garbage signature", sig: []byte("signature"), wantErr: ErrSignature},
		{name: "join report signature", sig: reportSig, wantErr: ErrSignature},

		{name: "endpoint changed", after: func(r *Registration) { r.Endpoints = []string{"evil.example.com:7443"} }, wantErr: ErrSignature},
		{name: "endpoint added", after: func(r *Registration) { r.Endpoints = append(r.Endpoints, "evil.example.com:7443") }, wantErr: ErrSignature},
		{name: "endpoints reordered", after: func(r *Registration) { r.Endpoints[0], r.Endpoints[1] = r.Endpoints[1], r.Endpoints[0] }, wantErr: ErrSignature},
		{name: "version changed", after: func(r *Registration) { r.Version++ }, wantErr: ErrSignature},
		{name: "policy changed", after: func(r *Registration) {
			r.Policy = json.RawMessage(policyJSON(t, func(p *Policy) { p.NewAgentsPerDay = 0 }))
		}, wantErr: ErrSignature},
		{name: "policy field added", after: func(r *Registration) {
			r.Policy = json.RawMessage(policyJSON(t, func(p *Policy) { p.AllowedCIDRs = []string{"0.0.0.0/0"} }))
		}, wantErr: ErrSignature},
		{name: "bundle grew", after: func(r *Registration) { r.CABundlePEM = pemOf(h.Root, h.Issuer(ca.RoleAgent).Cert) }, wantErr: ErrSignature},
		{name: "authority ID with another name", after: func(r *Registration) { r.AuthorityID = "staging-" + hex6 }, wantErr: ErrSignature},
		{name: "policy certificate re-issued", after: func(r *Registration) { r.PolicyCertificatePEM = pemOf(reissued) }, wantErr: ErrSignature},

		{name: "policy not JSON", after: func(r *Registration) { r.Policy = json.RawMessage(`{"rate_limits":`) }, wantMsg: "policy is not valid JSON"},
		{name: "no policy", after: func(r *Registration) { r.Policy = nil }, wantMsg: "policy is not valid JSON"},
		{name: "policy too large", after: func(r *Registration) { r.Policy = append(r.Policy, bytes.Repeat([]byte(" "), MaxPolicyBytes)...) },
			wantMsg: "policy is larger than"},
		{name: "signed policy that is not valid", before: func(r *Registration) {
			r.Policy = json.RawMessage(`{"rate_limits":{}}`)
		}, wantMsg: "rate_limits.per_node_source"},
		{name: "signed policy with an unknown field", before: func(r *Registration) {
			r.Policy = json.RawMessage(strings.TrimSuffix(defaultCanonical, "}") + `,"x":1}`)
		}, wantMsg: `unknown field "x"`},
		{name: "signed policy with a duplicate key", before: func(r *Registration) {
			r.Policy = json.RawMessage(`{"new_agents_per_day":0,` + defaultCanonical[1:])
		}, sig: []byte("unused"), wantMsg: "uplicate key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := validRegistration(t, h)
			if tc.before != nil {
				tc.before(&r)
			}
			key := tc.key
			if key == nil {
				key = policyKey
			}
			sig := tc.sig
			if sig == nil {
				sig = signRegistration(t, r, key)
			}
			if tc.after != nil {
				tc.after(&r)
			}
			v, err := r.Verify(sig)
			if err == nil {
				t.Fatalf("Verify succeeded: %+v", v.Registration)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("Verify = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Verify = %q, want it to contain %q", err, tc.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "discovery: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestRegistrationVerifyAccepts(t *testing.T) {
	h, _ := testHierarchies(t)
	hex6 := strings.TrimPrefix(h.Fingerprint(), "sha256:")[:6]
	for _, tc := range []struct {
		name   string
		before func(r *Registration) // before signing
		after  func(r *Registration) // after signing
	}{
		{name: "as built"},
		{name: "authority ID with another name", before: func(r *Registration) { r.AuthorityID = "staging-2-" + hex6 }},
		{name: "16 endpoints", before: func(r *Registration) {
			r.Endpoints = repeat(16, func(i int) string { return fmt.Sprintf("a%d.example.com:%d", i, 7000+i) })
		}},
		{name: "bundle with intermediates after the root", before: func(r *Registration) {
			r.CABundlePEM = pemOf(h.Root, h.Issuer(ca.RoleServer).Cert, h.Issuer(ca.RoleBootstrap).Cert)
		}},
		{name: "highest version", before: func(r *Registration) { r.Version = 1<<53 - 1 }},
		{name: "port 65535", before: func(r *Registration) { r.Endpoints = []string{"a.example.com:65535"} }},
		{name: "policy re-formatted after signing", after: func(r *Registration) {
			r.Policy = json.RawMessage(`
			{
			  "rate_limits": {
			    "per_source":      {"burst": 20, "per_minute": 60},
			    "per_node_source": {"per_minute": 6, "burst": 3},
			    "per_authority":   {"burst": 100, "per_minute": 600}
			  },
			  "new_agents_per_day": 1000
			}`)
		}},
		{name: "policy numbers re-written after signing", before: func(r *Registration) {
			r.Policy = json.RawMessage(strings.Replace(defaultCanonical, `"new_agents_per_day":1000`, `"new_agents_per_day":1000.0`, 1))
		}, after: func(r *Registration) { r.Policy = json.RawMessage(defaultCanonical) }},
		{name: "policy escapes re-written after signing", before: func(r *Registration) {
			r.Policy = json.RawMessage(`{"node_id_pattern":"\u0077eb",` + defaultCanonical[1:])
		}, after: func(r *Registration) { r.Policy = json.RawMessage(`{"node_id_pattern":"web",` + defaultCanonical[1:]) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := validRegistration(t, h)
			if tc.before != nil {
				tc.before(&r)
			}
			sig := signRegistration(t, r, h.Issuer(ca.RolePolicy).Key)
			if tc.after != nil {
				tc.after(&r)
			}
			if _, err := r.Verify(sig); err != nil {
				t.Fatalf("Verify: %v", err)
			}
		})
	}
}

func TestRegistrationDocumentIsCanonical(t *testing.T) {
	h, _ := testHierarchies(t)
	r := validRegistration(t, h)
	want, err := r.Document()
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{
		defaultCanonical,
		"\n" + defaultCanonical + "\n",
		`{"rate_limits":{"per_source":{"per_minute":60,"burst":20},"per_node_source":{"per_minute":6,"burst":3},"per_authority":{"per_minute":600,"burst":100}},"new_agents_per_day":1e3}`,
		`{"new_agents_per_day":1000.000,"rate_limits":{"per_authority":{"burst":1E2,"per_minute":600},"per_node_source":{"burst":3,"per_minute":6},"per_source":{"burst":20,"per_minute":60}}}`,
	} {
		r.Policy = json.RawMessage(policy)
		got, err := r.Document()
		if err != nil {
			t.Fatalf("Document with policy %s: %v", policy, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("policy %s gives document\n%s\nwant\n%s", policy, got, want)
		}
	}
	if _, _, err := (Registration{Policy: json.RawMessage("{")}).Sign(h.Issuer(ca.RolePolicy).Key); err == nil {
		t.Error("Sign accepted a policy that is not JSON")
	}
}

func TestSignRefusesOtherKeys(t *testing.T) {
	h, _ := testHierarchies(t)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	r := validRegistration(t, h)
	if _, _, err := r.Sign(p384); err == nil {
		t.Error("Sign accepted a P-384 key, which Verify would refuse")
	}
}

func TestParseStored(t *testing.T) {
	h, _ := testHierarchies(t)
	r := validRegistration(t, h)
	r.Policy = json.RawMessage(policyJSON(t, func(p *Policy) { *p = fullPolicy() }))
	v, err := r.Verify(signRegistration(t, r, h.Issuer(ca.RolePolicy).Key))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseStored(v.Document)
	if err != nil {
		t.Fatalf("ParseStored: %v", err)
	}
	// The stored document holds the policy in its canonical form, which
	// for a policy built by json.Marshal is CanonicalPolicy.
	want := v.Registration
	want.Policy = json.RawMessage(v.CanonicalPolicy)
	if diff := cmp.Diff(want, got.Registration); diff != "" {
		t.Errorf("registration (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(fullPolicy(), got.ParsedPolicy, ignorePolicyInternals); diff != "" {
		t.Errorf("policy (-want +got):\n%s", diff)
	}
	if string(got.Document) != string(v.Document) || string(got.CanonicalPolicy) != string(v.CanonicalPolicy) ||
		got.Fingerprint != v.Fingerprint || !got.Root.Equal(v.Root) || !got.PolicyCert.Equal(v.PolicyCert) {
		t.Errorf("ParseStored = %+v, want %+v", got, v)
	}
	// What ParseStored rebuilds verifies with the stored signature.
	sig := signRegistration(t, r, h.Issuer(ca.RolePolicy).Key)
	if _, err := got.Registration.Verify(sig); err != nil {
		t.Errorf("the rebuilt registration does not verify: %v", err)
	}
	if err := got.ParsedPolicy.Admit(mustAddr("10.1.1.1"), "web-1"); err != nil {
		t.Errorf("the rebuilt policy is not compiled: %v", err)
	}

	report, err := (JoinReport{AuthorityID: r.AuthorityID, NodeID: "web-1", InstanceID: "i", JoinedAt: time.Now()}).Document()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		doc  string
	}{
		{"empty", ""},
		{"not JSON", "registration"},
		{"join report", string(report)},
		{"no type", strings.Replace(string(v.Document), `"type":"muster-register-authority"`, `"type":""`, 1)},
		{"bad bundle", strings.Replace(string(v.Document), "MII", "mii", 1)},
		{"bad policy", strings.Replace(string(v.Document), `"burst":3`, `"burst":0`, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseStored([]byte(tc.doc)); err == nil {
				t.Error("ParseStored succeeded")
			}
		})
	}
}

func TestCheckAuthorityID(t *testing.T) {
	h, _ := testHierarchies(t)
	fp := h.Fingerprint()
	hex6 := strings.TrimPrefix(fp, "sha256:")[:6]
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"prod-" + hex6, true},
		{"a-" + hex6, true},
		{"my-prod-2-" + hex6, true},
		{"prod-" + strings.ToUpper(hex6), false},
		{"prod-" + hex6[:5], false},
		{"prod-" + hex6 + "0", false},
		{"prod-" + hex6 + "-x", false},
		{"prod-000000", hex6 == "000000"},
		{"-" + hex6, false},
		{"Prod-" + hex6, false},
		{"prod--" + hex6, false},
		{"prod", false},
		{hex6, false},
		{"", false},
	} {
		t.Run(tc.id, func(t *testing.T) {
			err := CheckAuthorityID(tc.id, fp)
			if (err == nil) != tc.ok {
				t.Errorf("CheckAuthorityID(%q) = %v, want ok %v", tc.id, err, tc.ok)
			}
		})
	}
}

func FuzzRegistrationVerify(f *testing.F) {
	f.Add([]byte(defaultCanonical), "authority.example.com:7443", "[2001:db8::1]:7443", int64(1))
	full, _ := json.Marshal(fullPolicy())
	f.Add(full, "a:1", "", int64(2))
	f.Add([]byte(`{"a":1,"a":2}`), "a:1", "b:2", int64(1))
	f.Add([]byte(`{"n":1e400}`), "a:1", "b:2", int64(1))
	f.Add([]byte(`{"s":"\ud800"}`), "a:1", "b:2", int64(1))
	f.Add([]byte("{\"s\":\"\xff\"}"), "a:1", "b:2", int64(1))
	f.Add([]byte(`[1,2,3]`), "a:65535", "b:0", int64(1<<53))
	f.Add([]byte(`null`), ":", "[::1]:", int64(0))
	f.Fuzz(func(t *testing.T, policy []byte, ep1, ep2 string, version int64) {
		h, _ := testHierarchies(t)
		r := validRegistration(t, h)
		r.Policy = policy
		r.Endpoints = []string{ep1}
		if ep2 != "" {
			r.Endpoints = append(r.Endpoints, ep2)
		}
		r.Version = version
		_, sig, err := r.Sign(h.Issuer(ca.RolePolicy).Key)
		if err != nil {
			// Unsigned: verifying any signature must fail, not panic.
			if _, err := r.Verify([]byte("sig")); err == nil {
				t.Fatal("Verify accepted a registration Sign refused")
			}
			return
		}
		v, err := r.Verify(sig)
		if err != nil {
			return
		}
		stored, err := ParseStored(v.Document)
		if err != nil {
			t.Fatalf("ParseStored of a verified document: %v", err)
		}
		if string(stored.CanonicalPolicy) != string(v.CanonicalPolicy) {
			t.Fatalf("stored policy %s, verified %s", stored.CanonicalPolicy, v.CanonicalPolicy)
		}
		if _, err := stored.Registration.Verify(sig); err != nil {
			t.Fatalf("the stored registration does not verify: %v", err)
		}
		r.Version++
		if _, err := r.Verify(sig); err == nil {
			t.Fatal("Verify accepted another version with the same signature")
		}
	})
}

// TestRegistrationSignedPolicyIsEnforcedPolicy: a policy the decoder reads
// differently from its text (keys matched case-insensitively) is refused,
// so what the authority signed is what discovery enforces.
func TestRegistrationSignedPolicyIsEnforcedPolicy(t *testing.T) {
	h, _ := testHierarchies(t)
	r := validRegistration(t, h)
	r.Policy = []byte(strings.Replace(string(r.Policy), `"rate_limits"`, `"RATE_LIMITS"`, 1))
	sig := signRegistration(t, r, h.Issuer(ca.RolePolicy).Key)
	if _, err := r.Verify(sig); err == nil || !strings.Contains(err.Error(), "canonical") {
		t.Fatalf("Verify = %v, want a refusal of the non-canonical policy", err)
	}
}

// TestRegistrationCertificateValidity: an expired policy signing
// certificate is refused at the time of verification.
func TestRegistrationCertificateValidity(t *testing.T) {
	h, _ := testHierarchies(t)
	r := validRegistration(t, h)
	sig := signRegistration(t, r, h.Issuer(ca.RolePolicy).Key)
	if _, err := r.VerifyAt(sig, h.Issuer(ca.RolePolicy).Cert.NotAfter.Add(time.Hour)); err == nil || !strings.Contains(err.Error(), "not valid now") {
		t.Fatalf("VerifyAt after expiry = %v", err)
	}
	if _, err := r.VerifyAt(sig, time.Now()); err != nil {
		t.Fatal(err)
	}
}
