package ca

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// RootSet is the roots the authority uses now (DESIGN.md "CA lifecycle",
// "Root rotation"): the ones it trusts, the one that signs its
// intermediates, and the cross-certificates that let a holder of one
// trusted root accept the other.
type RootSet struct {
	// Trusted holds every trusted root, the signing one first.
	Trusted []*x509.Certificate
	// Cross holds the cross-certificates of the rotation in progress:
	// each has a root's subject and key, issued by the other root.
	Cross []*x509.Certificate
	// Signing is the root the active intermediates are signed by, and
	// SigningKey its key (nil when the authority does not hold it: the
	// data directory's root taken offline).
	Signing    *x509.Certificate
	SigningKey crypto.Signer
}

// SetRoots replaces the roots every check and signature uses from now on.
// Safe for concurrent use with Roots.
func (h *Hierarchy) SetRoots(r *RootSet) { h.live.roots.Store(r) }

// CurrentRoots returns what SetRoots last set, or nil: a new value after
// every change, so a check made against the roots can tell it is stale.
func (h *Hierarchy) CurrentRoots() *RootSet { return h.live.roots.Load() }

// Roots returns the roots set by SetRoots, or the data directory's root
// alone (with its key if the data directory holds it) before any was set.
func (h *Hierarchy) Roots() *RootSet {
	if r := h.live.roots.Load(); r != nil {
		return r
	}
	rs := &RootSet{Trusted: []*x509.Certificate{h.Root}, Signing: h.Root}
	if h.RootKey != nil {
		rs.SigningKey = h.RootKey
	}
	return rs
}

// NewRoot makes a root for the authority called name, like muster init's,
// valid from now for RootTTL, with serial (chosen by the caller so that
// key custody can name the key first): the successor of a root rotation.
func NewRoot(name string, serial *big.Int, key crypto.Signer, now time.Time) (*x509.Certificate, error) {
	if err := AllowedPublicKey(key.Public()); err != nil {
		return nil, err
	}
	spki, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(spki)
	tmpl := rootTemplate(name, now)
	// Its own name, so that tools which find issuers by name (openssl)
	// never confuse it with the root it replaces.
	tmpl.Subject.CommonName += " " + hex.EncodeToString(sum[:4])
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("ca: signing the new root: %w", err)
	}
	return x509.ParseCertificate(der)
}

// CrossSign certifies subject's key under issuer (whose key is issuerKey):
// a certificate with subject's name, key and constraints, issued by
// issuer, valid no longer than either. A holder that trusts issuer checks
// it with CheckSignatureFrom and then accepts subject as a root; it is
// never a link in a leaf's chain (a muster root allows one CA below it).
func CrossSign(subject, issuer *x509.Certificate, issuerKey crypto.Signer, now time.Time) (*x509.Certificate, error) {
	if !subject.IsCA || !issuer.IsCA {
		return nil, errors.New("ca: cross-signing needs two roots")
	}
	tmpl := &x509.Certificate{
		Subject:               subject.Subject,
		RawSubject:            subject.RawSubject,
		NotBefore:             now.Add(-Backdate),
		NotAfter:              subject.NotAfter,
		KeyUsage:              subject.KeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            subject.MaxPathLen,
		MaxPathLenZero:        subject.MaxPathLenZero,
		SubjectKeyId:          subject.SubjectKeyId,
	}
	if issuer.NotAfter.Before(tmpl.NotAfter) {
		tmpl.NotAfter = issuer.NotAfter
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, subject.PublicKey, issuerKey)
	if err != nil {
		return nil, fmt.Errorf("ca: cross-signing %q: %w", subject.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

// CrossCertifies reports whether cross is a valid cross-certificate at now
// of root's key by one of the trusted roots: root self-signed, cross a CA
// certificate with root's key, its signature by a trusted root's key. It is
// the one rule by which a holder of trusted roots accepts another
// (DESIGN.md "The trust bundle").
func CrossCertifies(cross, root *x509.Certificate, trusted []*x509.Certificate, now time.Time) bool {
	if cross == nil || root == nil || !cross.IsCA || !root.IsCA || root.CheckSignatureFrom(root) != nil {
		return false
	}
	if string(cross.RawSubjectPublicKeyInfo) != string(root.RawSubjectPublicKeyInfo) {
		return false
	}
	if now.Before(cross.NotBefore) || now.After(cross.NotAfter) {
		return false
	}
	for _, t := range trusted {
		if string(t.RawSubjectPublicKeyInfo) == string(root.RawSubjectPublicKeyInfo) {
			return true // already trusted
		}
		if cross.CheckSignatureFrom(t) == nil {
			return true
		}
	}
	return false
}
