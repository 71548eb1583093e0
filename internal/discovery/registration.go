package discovery

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/muster-dev/muster/internal/ca"
)

// Registration is an authority's entry as it signs it. Policy is the policy
// JSON as sent; canonicalization makes its spacing and key order irrelevant
// to the signature.
type Registration struct {
	AuthorityID          string
	Endpoints            []string
	CABundlePEM          string
	Policy               json.RawMessage
	Version              int64
	PolicyCertificatePEM string
}

// Limits on a registration.
const (
	maxEndpoints    = 16
	maxBundleBytes  = 64 << 10
	maxEndpointSize = 261 // a DNS name, ':' and a port
	// maxVersion is the largest integer RFC 8785 writes exactly (2^53-1):
	// above it two versions could share a canonical document, and so a
	// signature.
	maxVersion = 1<<53 - 1
)

// Document returns the canonical JSON that the signature covers.
func (r Registration) Document() ([]byte, error) {
	if !json.Valid(r.Policy) || !utf8.Valid(r.Policy) {
		return nil, errors.New("discovery: registration: policy is not valid JSON")
	}
	if !validUTF8(append([]string{r.AuthorityID, r.CABundlePEM, r.PolicyCertificatePEM}, r.Endpoints...)...) {
		return nil, errors.New("discovery: registration: a field is not valid UTF-8")
	}
	return canonical(registrationDoc{TypeRegistration, r.AuthorityID, r.Endpoints, r.CABundlePEM, r.Policy, r.Version, r.PolicyCertificatePEM})
}

// registrationDoc is the signed form of a Registration.
type registrationDoc struct {
	Type                 string          `json:"type"`
	AuthorityID          string          `json:"authority_id"`
	Endpoints            []string        `json:"endpoints"`
	CABundlePEM          string          `json:"ca_bundle_pem"`
	Policy               json.RawMessage `json:"policy"`
	Version              int64           `json:"version"`
	PolicyCertificatePEM string          `json:"policy_certificate_pem"`
}

// Sign returns the canonical document and its signature by the policy
// signing key.
func (r Registration) Sign(key crypto.Signer) (doc, sig []byte, err error) {
	if doc, err = r.Document(); err != nil {
		return nil, nil, err
	}
	sig, err = sign(key, doc)
	return doc, sig, err
}

// Verified is a registration whose signature and structure have been
// checked.
type Verified struct {
	Registration
	Document []byte
	// Root is the anchor, the root the authority ID names and is locked
	// to; Fingerprint its fingerprint.
	Root        *x509.Certificate
	Fingerprint string
	// Roots is the bundle parsed: the roots agents may pin now, and the
	// cross-certificates that link them to Root.
	Roots           Roots
	PolicyCert      *x509.Certificate
	ParsedPolicy    Policy
	CanonicalPolicy []byte
}

// Verify checks a registration as discovery receives it, structure first
// and the signature last: fields well-formed; the CA bundle starts with a
// self-signed root (the anchor); the authority ID names that root; the
// policy signing certificate is issued directly by it; the signature
// verifies; every other root of the bundle is linked to the anchor by its
// cross-certificates (roots.go); the policy parses. Whether the root is the one the authority ID is locked to, and
// whether the version is newer, are the store's to decide.
func (r Registration) Verify(sig []byte) (*Verified, error) {
	return r.VerifyAt(sig, time.Now())
}

// VerifyAt is Verify at a given time: the root and the policy signing
// certificate must be valid then (with the ±2-minute allowance for another
// machine's clock).
func (r Registration) VerifyAt(sig []byte, now time.Time) (*Verified, error) {
	if r.Version < 1 || r.Version > maxVersion {
		return nil, fmt.Errorf("discovery: registration: version must be between 1 and %d", int64(maxVersion))
	}
	if len(r.Endpoints) == 0 || len(r.Endpoints) > maxEndpoints {
		return nil, fmt.Errorf("discovery: registration: between 1 and %d endpoints", maxEndpoints)
	}
	for _, ep := range r.Endpoints {
		if err := CheckEndpoint(ep); err != nil {
			return nil, err
		}
	}
	if len(r.CABundlePEM) > maxBundleBytes || len(r.PolicyCertificatePEM) > maxBundleBytes {
		return nil, errors.New("discovery: registration: certificates too large")
	}
	roots, err := ParseRoots(r.CABundlePEM)
	if err != nil {
		return nil, err
	}
	root := roots.Anchor
	fp := ca.Fingerprint(root)
	if err := CheckAuthorityID(r.AuthorityID, fp); err != nil {
		return nil, err
	}
	certs, err := ca.ParseCertsPEM([]byte(r.PolicyCertificatePEM))
	if err != nil || len(certs) != 1 {
		return nil, errors.New("discovery: registration: policy_certificate_pem: want exactly one certificate")
	}
	if err := CheckPolicyCertificate(certs[0], root); err != nil {
		return nil, err
	}
	if len(r.Policy) > MaxPolicyBytes {
		return nil, fmt.Errorf("discovery: registration: policy is larger than %d bytes", MaxPolicyBytes)
	}
	doc, err := r.Document()
	if err != nil {
		return nil, err
	}
	if err := verify(certs[0], doc, sig); err != nil {
		return nil, err
	}
	for _, c := range []*x509.Certificate{root, certs[0]} {
		if now.Add(clockSkew).Before(c.NotBefore) || now.Add(-clockSkew).After(c.NotAfter) {
			return nil, fmt.Errorf("discovery: registration: certificate %q is not valid now (valid %s to %s)",
				c.Subject.CommonName, c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	// Roots other than the anchor only through cross-certificates that
	// chain to it (roots.go), checked once the signature is known good.
	if err := roots.Check(now); err != nil {
		return nil, err
	}
	v, err := verified(r, doc, roots, certs[0])
	if err != nil {
		return nil, err
	}
	// What was signed must be what is enforced: a policy whose keys only
	// decode case-insensitively, or with fields the decoder drops, would
	// sign one thing and mean another.
	if raw, err := canonicalRaw(r.Policy); err != nil || !bytes.Equal(raw, v.CanonicalPolicy) {
		return nil, errors.New("discovery: registration: the policy is not in its canonical field names and values (send Policy.Canonical())")
	}
	return v, nil
}

// verified completes a checked registration with its parsed policy.
func verified(r Registration, doc []byte, roots Roots, policyCert *x509.Certificate) (*Verified, error) {
	root := roots.Anchor
	p, err := ParsePolicy(r.Policy)
	if err != nil {
		return nil, err
	}
	cp, err := p.Canonical()
	if err != nil {
		return nil, err
	}
	return &Verified{Registration: r, Document: doc, Root: root, Fingerprint: ca.Fingerprint(root), Roots: roots, PolicyCert: policyCert,
		ParsedPolicy: p, CanonicalPolicy: cp}, nil
}

// clockSkew is DESIGN.md's allowance for times set by another machine.
const clockSkew = 2 * time.Minute

// ParseStored rebuilds a verified registration from the canonical document
// a store kept, checking its structure again but not the signature (the
// store is trusted with what discovery itself verified).
func ParseStored(doc []byte) (*Verified, error) {
	var d registrationDoc
	if err := json.Unmarshal(doc, &d); err != nil || d.Type != TypeRegistration {
		return nil, fmt.Errorf("discovery: stored registration is not a registration document (%v)", err)
	}
	r := Registration{d.AuthorityID, d.Endpoints, d.CABundlePEM, d.Policy, d.Version, d.PolicyCertificatePEM}
	roots, err := ParseRoots(r.CABundlePEM)
	if err != nil {
		return nil, fmt.Errorf("discovery: stored registration: bad CA bundle: %w", err)
	}
	certs, err := ca.ParseCertsPEM([]byte(r.PolicyCertificatePEM))
	if err != nil || len(certs) != 1 {
		return nil, errors.New("discovery: stored registration: bad policy certificate")
	}
	// The ID names the root it was derived from: a stored document whose ID
	// is missing or another root's would hand agents the wrong authority.
	if err := CheckAuthorityID(r.AuthorityID, ca.Fingerprint(roots.Anchor)); err != nil {
		return nil, fmt.Errorf("discovery: stored registration: %w", err)
	}
	return verified(r, doc, roots, certs[0])
}

// CheckEndpoint checks an endpoint as a registration carries it: HOST:PORT,
// a port from 1 to 65535 without a sign. The authority checks its
// configured endpoints with it at start, so a bad one is refused then,
// not at every registration.
func CheckEndpoint(ep string) error {
	host, port, err := net.SplitHostPort(ep)
	if err != nil || host == "" || len(ep) > maxEndpointSize {
		return fmt.Errorf("discovery: registration: endpoint %q is not HOST:PORT", ep)
	}
	// ParseUint, unlike Atoi, refuses a sign ("+443").
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n < 1 {
		return fmt.Errorf("discovery: registration: endpoint %q: bad port", ep)
	}
	return nil
}
