// Package crl publishes one certificate revocation list (RFC 5280, DER) per
// issuing intermediate, for relying parties that check the certificates
// muster issues: every unexpired certificate of a locked node, instance,
// public key or operator, and of a deleted node (DESIGN.md, "Revocation for
// relying parties").
//
// The lists live in the store, so every replica serves the same bytes and
// the CRL number is agreed by one conditional write: a replica that loses
// the race reads the winner's list and signs again only if it says
// something else. A list is signed again when what it must hold changes
// (the caller pokes the Publisher on the store's change notifications) and
// at half its validity, so a relying party that fetches it before
// nextUpdate never holds one that has expired.
//
// Locks are reversible, so their entries carry the reason certificateHold
// and leave the next list once the lock is gone; a deleted node's carry
// cessationOfOperation.
package crl

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// Issuer is one issuing intermediate: the certificate a CRL names as its
// issuer and the key that signs it. Role is the intermediate's role
// (bootstrap, server, agent, admin); several issuers may share a role
// while intermediates rotate. A nil Signer is an issuer whose key is
// lost: its stored list is served as it is and never re-signed.
type Issuer struct {
	Role   string
	Cert   *x509.Certificate
	Signer crypto.Signer
}

// Name is ROLE-SERIAL, the serial in lower-case hex: the list's name in
// the store and in its URL.
func (i Issuer) Name() string { return i.Role + "-" + i.Cert.SerialNumber.Text(16) }

// Path is the URL path an issuer's list is served at.
func Path(i Issuer) string { return "/crl/" + i.Name() + ".crl" }

// DistributionPoint is the URL a leaf of i names in its CRL Distribution
// Points: base (--crl-url) and Path.
func DistributionPoint(base string, i Issuer) string {
	return strings.TrimSuffix(base, "/") + Path(i)
}

// NameFromPath returns the list name a request path asks for, and false
// for a path that cannot name one.
func NameFromPath(p string) (string, bool) {
	name, ok := strings.CutPrefix(p, "/crl/")
	if !ok {
		return "", false
	}
	name, ok = strings.CutSuffix(name, ".crl")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", false
	}
	return name, true
}

// Reason codes (RFC 5280 section 5.3.1).
const (
	reasonCessationOfOperation = 5
	reasonCertificateHold      = 6
)

// entry is one revoked certificate as a list holds it.
type entry struct {
	serial   *big.Int
	hexSer   string
	revoked  time.Time // zero: not known (a deletion), taken at signing
	reason   int
	operator bool
}

// entriesFor returns the entries of issuer among revoked: an admin
// intermediate lists operators' certificates, an agent intermediate
// nodes', and each only certificates that fit inside its own validity
// (leaves are cut at their issuer's NotAfter, so every leaf it signed
// does). While intermediates of one role overlap, a list may hold a
// certificate its sibling signed: harmless, as a relying party matches
// the issuer and the serial (128 random bits) together. Sorted by serial,
// one entry per certificate (the earliest lock wins).
func entriesFor(issuer Issuer, revoked []store.RevokedCertificate) []entry {
	byKey := map[string]entry{}
	for _, r := range revoked {
		switch {
		case issuer.Role == "admin" && !r.Operator, issuer.Role == "agent" && r.Operator,
			issuer.Role != "admin" && issuer.Role != "agent":
			continue
		case r.NotBefore.Before(issuer.Cert.NotBefore) || r.NotAfter.After(issuer.Cert.NotAfter):
			continue
		}
		n, ok := new(big.Int).SetString(r.Serial, 16)
		if !ok || n.Sign() <= 0 {
			continue
		}
		e := entry{serial: n, hexSer: n.Text(16), revoked: r.Since, reason: reasonCertificateHold, operator: r.Operator}
		if r.Reason == store.RevokedReasonDeleted {
			e.reason = reasonCessationOfOperation
		}
		if old, ok := byKey[e.hexSer]; ok && (e.revoked.IsZero() || !old.revoked.IsZero() && old.revoked.Before(e.revoked)) {
			continue
		}
		byKey[e.hexSer] = e
	}
	out := make([]entry, 0, len(byKey))
	for _, e := range byKey {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b entry) int { return a.serial.Cmp(b.serial) })
	return out
}

// digest identifies a set of entries: serials and reasons, not times, so
// that a list says something new exactly when a certificate enters or
// leaves it.
func digest(entries []entry) []byte {
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintf(h, "%s %d\n", e.hexSer, e.reason)
	}
	return h.Sum(nil)
}

// Backdate is subtracted from a list's thisUpdate, as from a
// certificate's NotBefore, for relying parties whose clock runs behind.
const Backdate = time.Minute

// sign makes the DER list of issuer. A deleted node's entry has no time
// of its own (the store keeps none): it keeps the time an earlier list of
// the same issuer gave it (prev), else the signing time, so replicas and
// successive lists agree.
func sign(issuer Issuer, number int64, entries []entry, prev []byte, now time.Time, validity time.Duration) ([]byte, error) {
	earlier := map[string]time.Time{}
	if len(prev) > 0 {
		if rl, err := x509.ParseRevocationList(prev); err == nil {
			for _, e := range rl.RevokedCertificateEntries {
				earlier[e.SerialNumber.Text(16)] = e.RevocationTime
			}
		}
	}
	tmpl := &x509.RevocationList{
		Number:     big.NewInt(number),
		ThisUpdate: now.Add(-Backdate),
		NextUpdate: now.Add(validity),
	}
	for _, e := range entries {
		at := e.revoked
		if at.IsZero() {
			at = now
			if t, ok := earlier[e.hexSer]; ok {
				at = t
			}
		}
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{
			SerialNumber: e.serial, RevocationTime: at.UTC(), ReasonCode: e.reason,
		})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, issuer.Cert, issuer.Signer)
	if err != nil {
		return nil, fmt.Errorf("crl: signing the list of %s: %w", issuer.Name(), err)
	}
	return der, nil
}

// ErrUnknownIssuer: a list was asked for by a name that no issuing
// intermediate has now.
var ErrUnknownIssuer = errors.New("crl: no such issuing intermediate")

// sameBytes reports whether two digests are equal (they are public; no
// constant time needed).
func sameBytes(a, b []byte) bool { return bytes.Equal(a, b) }

// countEntries is the number of certificates a signed list names.
func countEntries(der []byte) (int, error) {
	rl, err := x509.ParseRevocationList(der)
	if err != nil {
		return 0, err
	}
	return len(rl.RevokedCertificateEntries), nil
}
