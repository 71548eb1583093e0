// Package identity holds an X.509 identity (certificate chain, private key
// and the trust anchors it was issued under) as one PEM file, and builds the
// TLS configurations that present it and verify a peer by its SPIFFE ID.
//
// Peers are verified the SPIFFE way: the chain must end at a pinned root and
// the leaf must carry the expected SPIFFE ID; host names play no part, so an
// authority reached through a load balancer or by IP verifies the same way.
package identity

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/muster-dev/muster/internal/atomicfile"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// ErrMalformed reports an identity file that cannot be used.
var ErrMalformed = errors.New("identity: malformed identity file")

// Identity is a leaf certificate with its intermediates, its private key, and
// the roots its holder trusts.
type Identity struct {
	// Chain is the leaf first, then its intermediates.
	Chain []*x509.Certificate
	Key   crypto.Signer
	// Roots are the trust anchors (self-signed CA certificates).
	Roots []*x509.Certificate
}

// ID returns the SPIFFE ID of the leaf.
func (id *Identity) ID() (spiffeid.ID, error) {
	return spiffeid.FromCertificate(id.Chain[0])
}

// Leaf returns the leaf certificate.
func (id *Identity) Leaf() *x509.Certificate { return id.Chain[0] }

// Encode returns the PEM file: the chain, the key, then the roots.
func (id *Identity) Encode() ([]byte, error) {
	var buf bytes.Buffer
	for _, c := range id.Chain {
		buf.Write(ca.EncodeCertPEM(c))
	}
	key, err := ca.EncodeKeyPEM(id.Key)
	if err != nil {
		return nil, err
	}
	buf.Write(key)
	for _, c := range id.Roots {
		buf.Write(ca.EncodeCertPEM(c))
	}
	return buf.Bytes(), nil
}

// Decode parses a file written by Encode. Self-signed CA certificates are
// roots; the others form the chain in file order.
func Decode(data []byte) (*Identity, error) {
	id := &Identity{}
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		switch block.Type {
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
			}
			if IsRoot(c) {
				id.Roots = append(id.Roots, c)
			} else {
				id.Chain = append(id.Chain, c)
			}
		case "PRIVATE KEY":
			if id.Key != nil {
				return nil, fmt.Errorf("%w: more than one private key", ErrMalformed)
			}
			k, err := ca.ParseKeyPEM(pem.EncodeToMemory(block))
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
			}
			id.Key = k
		}
	}
	switch {
	case len(id.Chain) == 0:
		return nil, fmt.Errorf("%w: no certificate", ErrMalformed)
	case id.Key == nil:
		return nil, fmt.Errorf("%w: no private key", ErrMalformed)
	case len(id.Roots) == 0:
		return nil, fmt.Errorf("%w: no root certificate", ErrMalformed)
	}
	if !SamePublicKey(id.Key.Public(), id.Chain[0].PublicKey) {
		return nil, fmt.Errorf("%w: the private key does not match the certificate", ErrMalformed)
	}
	return id, nil
}

// Load reads an identity file. It refuses a file other users can read.
func Load(path string) (*Identity, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("identity: %s is readable by other users (mode %v): run chmod 600 on it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	id, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return id, nil
}

// Save writes the identity atomically with mode 0600. It refuses to replace
// an existing file unless overwrite is set.
func (id *Identity) Save(path string, overwrite bool) error {
	data, err := id.Encode()
	if err != nil {
		return err
	}
	if !overwrite {
		if _, err := os.Stat(path); err == nil {
			return fmt.Errorf("identity: %s already exists", path)
		}
	}
	return WriteFileAtomic(path, data, 0o600)
}

// WriteFileAtomic writes data so that readers see the old file or the new
// one, never a mix (see package atomicfile).
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return atomicfile.Write(path, data, perm)
}

// TLSCertificate returns the identity as a tls.Certificate.
func (id *Identity) TLSCertificate() tls.Certificate {
	tc := tls.Certificate{PrivateKey: id.Key, Leaf: id.Chain[0]}
	for _, c := range id.Chain {
		tc.Certificate = append(tc.Certificate, c.Raw)
	}
	return tc
}

// RootPool returns the roots as a pool.
func (id *Identity) RootPool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, r := range id.Roots {
		p.AddCert(r)
	}
	return p
}

// Matcher accepts or refuses a peer's SPIFFE ID.
type Matcher func(spiffeid.ID) error

// MatchID accepts exactly want.
func MatchID(want spiffeid.ID) Matcher {
	return func(got spiffeid.ID) error {
		if got != want {
			return fmt.Errorf("identity: peer is %s, want %s", got, want)
		}
		return nil
	}
}

// MatchRole accepts any ID of role in trust domain td.
func MatchRole(td string, role spiffeid.Role) Matcher {
	return func(got spiffeid.ID) error {
		if got.TrustDomain != td || got.Role != role {
			return fmt.Errorf("identity: peer is %s, want a %s of trust domain %s", got, role, td)
		}
		return nil
	}
}

// ClientTLS returns a client configuration that presents the identity (when
// id is not nil; its leaf alone to a server that names the leaf's issuer,
// see presented) and accepts only a server whose chain ends at roots and
// whose leaf's SPIFFE ID match accepts.
func ClientTLS(id *Identity, roots *x509.CertPool, match Matcher) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Host names are not how muster identifies an authority: the
		// SPIFFE ID is, checked in VerifyConnection below.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return VerifyPeer(cs.PeerCertificates, roots, match, x509.ExtKeyUsageServerAuth, time.Now())
		},
		NextProtos: []string{"h2"},
	}
	if id != nil {
		cfg.GetClientCertificate = id.presented()
	}
	return cfg
}

// presented returns what the identity presents to a server that asks for a
// client certificate: its leaf alone when the server names the leaf's
// issuer among the authorities it accepts (an authority names its own
// agent and admin intermediates, so it has the intermediate and need not
// keep a copy of it for every connection), and the whole chain otherwise,
// as to a server that names none. Only the identity's own certificates are
// ever presented, whatever the server names.
func (id *Identity) presented() func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	whole := id.TLSCertificate()
	if !id.issuedByChain() {
		return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &whole, nil }
	}
	leaf := id.Chain[0]
	alone := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: id.Key, Leaf: leaf}
	return func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		for _, name := range cri.AcceptableCAs {
			if bytes.Equal(name, leaf.RawIssuer) {
				return &alone, nil
			}
		}
		return &whole, nil
	}
}

// issuedByChain reports whether the chain's second certificate is the
// leaf's issuer, by name and, when both carry one, by key identifier: the
// leaf may then be presented alone to a server that names that issuer.
// The signature is not checked here: the server checks what it is given,
// and a chain whose intermediate did not sign the leaf is refused by it
// either way.
func (id *Identity) issuedByChain() bool {
	if len(id.Chain) < 2 {
		return false
	}
	leaf, inter := id.Chain[0], id.Chain[1]
	if !bytes.Equal(leaf.RawIssuer, inter.RawSubject) {
		return false
	}
	return len(leaf.AuthorityKeyId) == 0 || len(inter.SubjectKeyId) == 0 || bytes.Equal(leaf.AuthorityKeyId, inter.SubjectKeyId)
}

// UntrustedRootError reports a peer certificate that does not chain to
// the roots pinned, nor through a cross-certificate the peer presented
// (VerifyPeer): the peer is under a root this side does not hold, as after
// a root rotation it missed, whose way out is an identity under the
// current root. Err is x509's reason, an x509.UnknownAuthorityError. Callers
// tell it apart with errors.As, never by its text, which any other error
// can imitate (over gRPC, verifyerr carries it past the transport).
type UntrustedRootError struct{ Err error }

func (e *UntrustedRootError) Error() string {
	return "identity: peer certificate does not chain to the pinned root: " + e.Err.Error()
}

func (e *UntrustedRootError) Unwrap() error { return e.Err }

// VerifyPeer checks that certs (leaf first, then intermediates) chain to
// roots for usage and that match accepts the leaf's SPIFFE ID. A chain to
// no root held is an *UntrustedRootError; a chain to one that fails
// otherwise (expired or not yet valid, as with a clock off, or not for
// usage) is not, since an identity under another root would not help.
func VerifyPeer(certs []*x509.Certificate, roots *x509.CertPool, match Matcher, usage x509.ExtKeyUsage, now time.Time) error {
	if len(certs) == 0 {
		return errors.New("identity: peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}
	if _, err := certs[0].Verify(opts); err != nil {
		more := crossCertified(certs[1:], roots, now)
		if more == nil {
			return verifyFailed(err)
		}
		opts.Roots = more
		if _, err := certs[0].Verify(opts); err != nil {
			return verifyFailed(err)
		}
	}
	got, err := spiffeid.FromCertificate(certs[0])
	if err != nil {
		return fmt.Errorf("identity: peer certificate: %w", err)
	}
	return match(got)
}

// verifyFailed is VerifyPeer's error for x509's err: an
// *UntrustedRootError when no chain reached a root held.
func verifyFailed(err error) error {
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		return &UntrustedRootError{Err: err}
	}
	return fmt.Errorf("identity: peer certificate does not verify: %w", err)
}

// crossCertified returns roots with every root the peer presented that a
// cross-certificate it also presented certifies under one of roots (DESIGN.md
// "Root rotation": during a root rotation the authority presents its other
// root and the cross-certificate between them, so a holder of either root
// accepts it), or nil when it presented none.
func crossCertified(presented []*x509.Certificate, roots *x509.CertPool, now time.Time) *x509.CertPool {
	more := CrossCertified(presented, roots, now)
	if len(more) == 0 {
		return nil
	}
	pool := roots.Clone()
	for _, r := range more {
		pool.AddCert(r)
	}
	return pool
}

// CrossCertified returns the roots among presented that a cross-certificate
// also among presented certifies under roots: the cross-certificate must
// verify directly under a root of the pool, at now. It is never a link in
// a leaf's chain, only the way another root is accepted, by the same rule
// as the trust bundle's for a new root.
func CrossCertified(presented []*x509.Certificate, roots *x509.CertPool, now time.Time) []*x509.Certificate {
	var out []*x509.Certificate
	for _, r := range presented {
		if !IsRoot(r) {
			continue
		}
		for _, x := range presented {
			if x == r || !x.IsCA || !bytes.Equal(x.RawSubjectPublicKeyInfo, r.RawSubjectPublicKeyInfo) || IsRoot(x) {
				continue
			}
			if _, err := x.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				continue
			}
			out = append(out, r)
			break
		}
	}
	return out
}

// IsRoot reports whether c is a self-signed CA certificate: a trust anchor.
func IsRoot(c *x509.Certificate) bool {
	return c.IsCA && bytes.Equal(c.RawSubject, c.RawIssuer) && c.CheckSignatureFrom(c) == nil
}

// SamePublicKey reports whether a and b are the same public key.
func SamePublicKey(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}
