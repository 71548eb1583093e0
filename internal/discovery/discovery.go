// Package discovery holds the rules of muster's optional directory of
// authorities (DESIGN.md, join method 2): the policy an authority signs
// and discovery enforces, the signed documents an authority sends
// (registration, join report) and their verification, and the rate limits
// of ticket requests. Signed documents are canonical JSON (RFC 8785)
// signed with ECDSA P-256 by the authority's policy signing certificate,
// which must be issued directly by the root the authority ID is locked to.
//
// Referral tickets themselves are in package referral, shared with the
// authority that checks them.
package discovery

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"

	"github.com/muster-dev/muster/internal/ca"
)

// Document types, signed inside each document so a signature over one kind
// can never be presented as the other.
const (
	TypeRegistration = "muster-register-authority"
	TypeJoinReport   = "muster-join-report"
)

// ErrSignature is returned when a document's signature does not verify.
var ErrSignature = errors.New("discovery: signature does not verify with the policy signing certificate")

// canonical marshals v and returns its RFC 8785 form.
func canonical(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("discovery: canonical JSON: %w", err)
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("discovery: canonical JSON: %w", err)
	}
	return out, nil
}

// canonicalRaw returns the RFC 8785 form of a JSON text as given.
func canonicalRaw(raw []byte) ([]byte, error) {
	return jcs.Transform(raw)
}

// validUTF8 reports whether every s is valid UTF-8. json.Marshal replaces
// invalid bytes with U+FFFD, so two different strings would share one
// canonical form, and so one signature; documents refuse them instead.
func validUTF8(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// sign signs a canonical document with the policy signing key.
func sign(key crypto.Signer, doc []byte) ([]byte, error) {
	if pub, ok := key.Public().(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		return nil, errors.New("discovery: the policy signing key is not ECDSA P-256")
	}
	sum := sha256.Sum256(doc)
	return key.Sign(rand.Reader, sum[:], crypto.SHA256)
}

// verify checks sig over doc with the policy certificate's key.
func verify(policyCert *x509.Certificate, doc, sig []byte) error {
	pub, ok := policyCert.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return errors.New("discovery: the policy signing certificate's key is not ECDSA P-256")
	}
	sum := sha256.Sum256(doc)
	if !ecdsa.VerifyASN1(pub, sum[:], sig) {
		return ErrSignature
	}
	return nil
}

// CheckPolicyCertificate checks that cert can sign for root: issued
// directly by root, not a CA, with the digital-signature usage. Agent and
// server certificates chain to the same root through an intermediate, and
// intermediates are CAs, so neither passes.
func CheckPolicyCertificate(cert, root *x509.Certificate) error {
	if err := cert.CheckSignatureFrom(root); err != nil {
		return fmt.Errorf("discovery: the policy signing certificate is not issued by the root: %w", err)
	}
	if cert.IsCA || cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return errors.New("discovery: the certificate is not a policy signing certificate (it is a CA or lacks the digital-signature usage)")
	}
	return nil
}

// CheckAuthorityID checks that id is "<name>-<first 6 hex of the
// fingerprint>", the form muster init gives it, so an authority ID names
// its root.
func CheckAuthorityID(id, fingerprint string) error {
	if err := ValidAuthorityID(id); err != nil {
		return err
	}
	i := strings.LastIndex(id, "-")
	if want := ca.AuthorityID(id[:i], fingerprint); want != id {
		return fmt.Errorf("discovery: authority ID %q does not match its root (whose fingerprint %s gives %s)", id, fingerprint, want)
	}
	return nil
}
