// Package ca holds muster's certificate hierarchy: an ECDSA P-256 root, four
// intermediates each limited to one purpose (bootstrap listener, server,
// agent, admin), and a policy signing certificate. It issues leaf
// certificates whose every field the authority chooses; a CSR only proves
// possession of the key.
package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"time"
)

// Role names one certificate of the hierarchy below the root.
type Role string

const (
	RoleBootstrap Role = "bootstrap"
	RoleServer    Role = "server"
	RoleAgent     Role = "agent"
	RoleAdmin     Role = "admin"
	RolePolicy    Role = "policy"
)

// Roles lists every role in the order the hierarchy is created and stored.
var Roles = []Role{RoleBootstrap, RoleServer, RoleAgent, RoleAdmin, RolePolicy}

// Lifetimes of the hierarchy and the clock-skew allowance of every
// certificate.
const (
	RootTTL         = 10 * 365 * 24 * time.Hour
	IntermediateTTL = 365 * 24 * time.Hour
	PolicyTTL       = 10 * 365 * 24 * time.Hour
	// Backdate is subtracted from NotBefore so a peer whose clock runs a
	// little behind accepts a certificate issued just now.
	Backdate = time.Minute
)

// Errors for CSRs and keys from outside. The service layer maps both to
// INVALID_ARGUMENT.
var (
	ErrBadCSR  = errors.New("certificate request is malformed or its signature does not verify")
	ErrKeyType = errors.New("key type not allowed: want ECDSA P-256 or Ed25519")
	// ErrIssuerExpired: the intermediate asked to sign is past its
	// not-after, so it issues nothing until a successor replaces it.
	ErrIssuerExpired = errors.New("it issues nothing")
)

// eku is what each intermediate may sign for. Verifiers (Go's, OpenSSL's)
// enforce EKUs down the chain, so a leaf minted under an intermediate for
// a purpose the intermediate lacks fails to verify, not just to authorize:
// a client certificate under the server or bootstrap intermediate, and
// anything but a client certificate under the admin one.
//
// The agent intermediate allows serverAuth as well, so the SVID of a
// machine whose token or bot says --svid-usage client,server verifies as a
// TLS server certificate in OpenSSL and BoringSSL (Envoy). Which agent
// leaves carry serverAuth is the authority's policy (enroll), not the
// intermediate's; that an agent leaf is never the authority's server
// identity rests on its SPIFFE ID (spiffe://TD/agent/…, set by the
// authority, matched exactly by every client of the authority), see
// docs/threat-model.md. Before this, agent intermediates were clientAuth
// only; those still valid keep that until their next rotation.
var eku = map[Role][]x509.ExtKeyUsage{
	RoleBootstrap: {x509.ExtKeyUsageServerAuth},
	RoleServer:    {x509.ExtKeyUsageServerAuth},
	RoleAgent:     {x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	RoleAdmin:     {x509.ExtKeyUsageClientAuth},
}

// Issuer is a certificate with its key.
type Issuer struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CRLDistributionPoints, if set, are named in every leaf Issue signs:
	// where relying parties fetch this issuer's revocation list.
	CRLDistributionPoints []string
	// fixed holds the extensions every leaf of this issuer carries,
	// encoded once (leafTemplate).
	fixed atomic.Pointer[leafExtensions]
}

// Hierarchy is the root and the certificates under it. RootKey is nil when
// the root key has been moved out of the authority's data directory.
//
// Issuers are the certificates made by muster init and kept in the data
// directory; once the authority has read its store, the intermediates
// there (SetIntermediates) take their place for every leaf it signs.
type Hierarchy struct {
	Root    *x509.Certificate
	RootKey *ecdsa.PrivateKey
	Issuers map[Role]*Issuer
	live    live
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,54}[a-z0-9])?$`)

// ValidName checks an authority name. With "-" and six hex digits appended
// it must stay a valid node ID and DNS label (63 characters).
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("authority name %q: want 1-56 of a-z 0-9 -, starting and ending with a letter or digit", name)
	}
	return nil
}

// Create makes a new hierarchy for the authority called name.
func Create(name string, now time.Time) (*Hierarchy, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	rootKey, err := newKey()
	if err != nil {
		return nil, err
	}
	rootTmpl := rootTemplate(name, now)
	root, err := sign(rootTmpl, rootKey.Public(), rootTmpl, rootKey)
	if err != nil {
		return nil, err
	}
	h := &Hierarchy{Root: root, RootKey: rootKey, Issuers: map[Role]*Issuer{}}
	for _, role := range Roles {
		key, err := newKey()
		if err != nil {
			return nil, err
		}
		tmpl := intermediateTemplate(role, pkix.Name{Organization: []string{"muster"}, CommonName: name + " " + string(role) + " CA"}, now, IntermediateTTL)
		if role == RolePolicy {
			tmpl.Subject.CommonName = name + " policy signing"
			tmpl.NotAfter = now.Add(PolicyTTL)
			tmpl.KeyUsage = x509.KeyUsageDigitalSignature
			tmpl.IsCA, tmpl.MaxPathLenZero = false, false
		}
		cert, err := sign(tmpl, key.Public(), root, rootKey)
		if err != nil {
			return nil, err
		}
		h.Issuers[role] = &Issuer{Cert: cert, Key: key}
	}
	return h, nil
}

func intermediateTemplate(role Role, subject pkix.Name, now time.Time, ttl time.Duration) *x509.Certificate {
	return &x509.Certificate{
		Subject:               subject,
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		ExtKeyUsage:           eku[role],
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
}

func rootTemplate(name string, now time.Time) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{"muster"}, CommonName: name + " root CA"},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(RootTTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// Root → intermediate → leaf: one CA below the root, no more.
		MaxPathLen: 1,
	}
}

// NewIntermediate signs, with the root key, a successor of role's
// intermediate for the public key pub (made by key custody), valid from
// now for ttl, cut at the root's expiry (Draft, SignDraft).
//
// serial is chosen by the caller (NewSerial) so that custody can name the
// key after it before the certificate exists.
func (h *Hierarchy) NewIntermediate(role Role, serial *big.Int, pub crypto.PublicKey, rootKey crypto.Signer, now time.Time, ttl time.Duration) (*x509.Certificate, error) {
	return h.NewIntermediateUnder(role, serial, pub, h.Root, rootKey, now, ttl)
}

// NewIntermediateUnder is NewIntermediate signed by root (the data
// directory's, or the one a root rotation made), whose key is rootKey.
func (h *Hierarchy) NewIntermediateUnder(role Role, serial *big.Int, pub crypto.PublicKey, root *x509.Certificate, rootKey crypto.Signer, now time.Time, ttl time.Duration) (*x509.Certificate, error) {
	if rootKey == nil {
		return nil, errors.New("ca: preparing an intermediate needs the root key")
	}
	d, err := h.Draft(role, serial, pub, root, now, ttl)
	if err != nil {
		return nil, err
	}
	return SignDraft(d, root, rootKey)
}

// NewSerial returns a fresh certificate serial: positive, 128 random bits.
func NewSerial() (*big.Int, error) { return randomSerial() }

func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// randomSerial returns a positive 128-bit serial, so serials never collide
// across replicas and reveal nothing about issuance volume.
func randomSerial() (*big.Int, error) {
	// 16 random bytes read as a big-endian number: uniform over
	// [0, 2^128), as rand.Int(rand.Reader, 2^128) is, in two allocations
	// rather than five.
	var b [16]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		if n := new(big.Int).SetBytes(b[:]); n.Sign() > 0 {
			return n, nil
		}
	}
}

func sign(tmpl *x509.Certificate, pub crypto.PublicKey, parent *x509.Certificate, key crypto.Signer) (*x509.Certificate, error) {
	signed, err := signDER(tmpl, pub, parent, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(signed.Raw)
}

func signDER(tmpl *x509.Certificate, pub crypto.PublicKey, parent *x509.Certificate, key crypto.Signer) (Signed, error) {
	serial, err := randomSerial()
	if err != nil {
		return Signed{}, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return Signed{}, fmt.Errorf("ca: signing %q: %w", tmpl.Subject.CommonName, err)
	}
	// The validity as the DER holds it, and so as ParseCertificate reads
	// it: UTC, whole seconds (x509 encodes the time without its
	// fraction).
	return Signed{Raw: der, SerialNumber: serial,
		NotBefore: tmpl.NotBefore.UTC().Truncate(time.Second),
		NotAfter:  tmpl.NotAfter.UTC().Truncate(time.Second)}, nil
}

// Signed is a leaf as Sign made it: its DER and the fields a renewal
// records, without parsing the DER back (about 55 allocations and a
// few per cent of a kept renewal's handler; docs/performance.md, the
// twelfth session). Each field equals the parsed certificate's.
type Signed struct {
	Raw          []byte
	SerialNumber *big.Int
	NotBefore    time.Time
	NotAfter     time.Time
}

// RootPool returns a pool holding every trusted root (Roots): the data
// directory's alone unless a root rotation is under way or done.
func (h *Hierarchy) RootPool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, r := range h.Roots().Trusted {
		p.AddCert(r)
	}
	return p
}

// Fingerprint returns the pin of the root's public key.
func (h *Hierarchy) Fingerprint() string { return Fingerprint(h.Root) }

// Fingerprint returns "sha256:" + lower-case hex of SHA-256 over the
// certificate's SubjectPublicKeyInfo, as kubeadm pins a CA: a root re-issued
// with the same key keeps its pin.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ParseFingerprint checks the form of a fingerprint and returns it in
// canonical (lower-case) form.
func ParseFingerprint(s string) (string, error) {
	hexPart, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hexPart) != 64 {
		return "", fmt.Errorf("CA fingerprint %q: want sha256: followed by 64 hex digits", s)
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return "", fmt.Errorf("CA fingerprint %q: want sha256: followed by 64 hex digits", s)
	}
	return "sha256:" + strings.ToLower(hexPart), nil
}

// MatchesFingerprint reports whether c's public key has the pin fp.
func MatchesFingerprint(c *x509.Certificate, fp string) bool {
	return SameFingerprint(Fingerprint(c), fp)
}

// SameFingerprint reports whether a and b are well-formed and the same pin
// (hex case aside).
func SameFingerprint(a, b string) bool {
	fa, err1 := ParseFingerprint(a)
	fb, err2 := ParseFingerprint(b)
	return err1 == nil && err2 == nil && fa == fb
}

// AuthorityID is "<name>-<first 6 hex of the fingerprint>".
func AuthorityID(name, fingerprint string) string {
	return name + "-" + strings.TrimPrefix(fingerprint, "sha256:")[:6]
}

// LeafRequest is everything a leaf certificate says. The authority fills it;
// nothing in it comes from a CSR except PublicKey.
type LeafRequest struct {
	PublicKey   crypto.PublicKey
	SPIFFEID    *url.URL
	CommonName  string
	DNSNames    []string
	IPAddresses []net.IP
	ServerAuth  bool
	ClientAuth  bool
	// NotBefore is the issuance time; the certificate is valid from
	// Backdate earlier until NotBefore+TTL, cut at the issuer's expiry.
	NotBefore time.Time
	TTL       time.Duration
}

// Issue signs a leaf certificate.
func (i *Issuer) Issue(req LeafRequest) (*x509.Certificate, error) {
	signed, err := i.Sign(req)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(signed.Raw)
}

// Sign signs a leaf certificate as Issue does and returns it unparsed,
// for a caller that needs only its DER, serial and validity.
func (i *Issuer) Sign(req LeafRequest) (Signed, error) {
	if !i.Cert.IsCA {
		return Signed{}, fmt.Errorf("ca: %q is not a CA", i.Cert.Subject.CommonName)
	}
	if err := AllowedPublicKey(req.PublicKey); err != nil {
		return Signed{}, err
	}
	if req.TTL <= 0 {
		return Signed{}, errors.New("ca: certificate lifetime must be positive")
	}
	if !req.ServerAuth && !req.ClientAuth {
		return Signed{}, errors.New("ca: a leaf needs server or client auth")
	}
	// A leaf of an expired issuer would be expired when issued.
	if !i.Cert.NotAfter.After(req.NotBefore) {
		return Signed{}, fmt.Errorf("ca: the intermediate %q (serial %s) has expired (at %s): %w; the CA rotation that replaces it needs the root key (see docs/ca-lifecycle.md)",
			i.Cert.Subject.CommonName, i.Cert.SerialNumber.Text(16), i.Cert.NotAfter.UTC().Format(time.RFC3339), ErrIssuerExpired)
	}
	buf := templates.Get().(*templateBuf)
	defer buf.release()
	return signDER(i.leafTemplate(req, buf), req.PublicKey, i.Cert, i.Key)
}

// ChainPEM returns leaf then the issuer's certificate, PEM encoded.
func (i *Issuer) ChainPEM(leaf *x509.Certificate) []byte { return i.ChainPEMOf(leaf.Raw) }

// ChainPEMOf returns the leaf of DER leaf then the issuer's
// certificate, PEM encoded.
func (i *Issuer) ChainPEMOf(leaf []byte) []byte {
	out := make([]byte, 0, CertPEMLen(leaf)+CertPEMLen(i.Cert.Raw))
	return AppendCertPEM(AppendCertPEM(out, leaf), i.Cert.Raw)
}

// AllowedPublicKey accepts ECDSA P-256 and Ed25519 keys.
func AllowedPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() {
			return nil
		}
	case ed25519PublicKey:
		return nil
	}
	return ErrKeyType
}
