package ca

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

// Draft is what a successor intermediate's certificate says, decided by
// the authority (its serial, its key made by custody, its validity by the
// store clock), so that whoever holds the root key can sign it: the
// authority itself, or an operator whose root key is offline (muster ca
// rotate ROLE --root-key FILE), who signs it on the machine holding the
// root key without that key or the intermediate's going over the wire.
type Draft struct {
	Role       Role
	Serial     *big.Int
	Public     crypto.PublicKey
	RawSubject []byte // the role's subject as muster init made it
	NotBefore  time.Time
	NotAfter   time.Time
}

// ErrSuccessor: a certificate offered as a role's successor is not one
// (wrong issuer, key, serial, subject, usage or validity). The wrapped
// message says which.
var ErrSuccessor = errors.New("ca: not a successor intermediate")

// Draft returns the successor of role's intermediate for pub, to be signed
// by root (the signing root: the data directory's, or the one a root
// rotation made), valid from now (backdated) for ttl, cut at root's expiry. It keeps the subject
// of the intermediate muster init made, so names a client was told (a TLS
// CertificateRequest) still match; the key identifiers tell them apart.
func (h *Hierarchy) Draft(role Role, serial *big.Int, pub crypto.PublicKey, root *x509.Certificate, now time.Time, ttl time.Duration) (Draft, error) {
	first := h.Issuers[role]
	if first == nil || eku[role] == nil {
		return Draft{}, fmt.Errorf("ca: no %s intermediate to succeed", role)
	}
	if err := AllowedPublicKey(pub); err != nil {
		return Draft{}, err
	}
	d := Draft{Role: role, Serial: serial, Public: pub, RawSubject: first.Cert.RawSubject,
		NotBefore: now.Add(-Backdate), NotAfter: now.Add(ttl)}
	if d.NotAfter.After(root.NotAfter) {
		d.NotAfter = root.NotAfter
	}
	return d, nil
}

// SignDraft signs d with the root key. root is the root certificate;
// rootKey must be its key.
func SignDraft(d Draft, root *x509.Certificate, rootKey crypto.Signer) (*x509.Certificate, error) {
	if rootKey == nil {
		return nil, errors.New("ca: preparing an intermediate needs the root key")
	}
	if !samePublicKey(rootKey.Public(), root.PublicKey) {
		return nil, errors.New("ca: the key given is not this authority's root key")
	}
	if eku[d.Role] == nil {
		return nil, fmt.Errorf("ca: %q is not a rotated intermediate role", d.Role)
	}
	// muster init's template, with the draft's subject, serial and times.
	tmpl := intermediateTemplate(d.Role, pkix.Name{}, d.NotBefore.Add(Backdate), d.NotAfter.Sub(d.NotBefore.Add(Backdate)))
	tmpl.RawSubject, tmpl.SerialNumber = d.RawSubject, d.Serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root, d.Public, rootKey)
	if err != nil {
		return nil, fmt.Errorf("ca: signing the %s intermediate: %w", d.Role, err)
	}
	return x509.ParseCertificate(der)
}

// CheckSuccessor checks that cert, signed elsewhere (SignDraft on the
// machine holding the root key), is a successor of role's intermediate:
// signed by root (the signing root), for pub and serial, with the role's subject and
// usage, valid at now and not past the root. It returns an error wrapping
// ErrSuccessor that says what is wrong.
func (h *Hierarchy) CheckSuccessor(role Role, serial *big.Int, pub crypto.PublicKey, cert, root *x509.Certificate, now time.Time) error {
	first := h.Issuers[role]
	bad := func(what string) error { return fmt.Errorf("%w: %s", ErrSuccessor, what) }
	switch {
	case first == nil || eku[role] == nil:
		return bad(fmt.Sprintf("%q is not a rotated intermediate role", role))
	case cert.CheckSignatureFrom(root) != nil:
		return bad("it is not signed by this authority's root key")
	case cert.SerialNumber.Cmp(serial) != 0:
		return bad("its serial is not the one the authority drafted")
	case !samePublicKey(cert.PublicKey, pub):
		return bad("its public key is not the one the authority made for it")
	case !bytes.Equal(cert.RawSubject, first.Cert.RawSubject):
		return bad("its subject is not the " + string(role) + " intermediate's")
	case !cert.IsCA || !cert.BasicConstraintsValid || cert.MaxPathLen != 0 || !cert.MaxPathLenZero:
		return bad("it is not a CA certificate with path length 0")
	case cert.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign || !slices.Equal(cert.ExtKeyUsage, eku[role]) || len(cert.UnknownExtKeyUsage) > 0:
		return bad("its key usage is not the " + string(role) + " intermediate's")
	case cert.NotAfter.After(root.NotAfter):
		return bad("it outlives the root")
	case !now.Before(cert.NotAfter) || now.Add(2*Backdate).Before(cert.NotBefore):
		return bad("it is not valid now")
	}
	return nil
}

// samePublicKey reports whether a and b are the same public key.
func samePublicKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}
