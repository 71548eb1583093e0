package trustbundle

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// MaxCerts bounds the certificates of a set an agent takes: a bundle holds
// two roots, eight intermediates (four roles, two generations) and two
// cross-certificates at most, in the middle of every rotation at once.
const MaxCerts = 64

// Set is the trust bundle as certificates (DESIGN.md "CA lifecycle": the
// trust bundle): the roots, the intermediates in every non-retired state
// and the cross-certificates of a root rotation. The authority builds one
// (Server.trustBundle); an agent holds one (certs/ca.crt and
// certs/bundle.pem) and takes another only through Take.
type Set struct {
	AuthorityID   string
	Roots         []*x509.Certificate
	Intermediates []*x509.Certificate
	// Cross are certificates of one root's key signed by another root.
	Cross []*x509.Certificate
}

// All returns the roots, intermediates and cross-certificates, in order.
func (s Set) All() []*x509.Certificate {
	all := make([]*x509.Certificate, 0, len(s.Roots)+len(s.Intermediates)+len(s.Cross))
	all = append(all, s.Roots...)
	all = append(all, s.Intermediates...)
	return append(all, s.Cross...)
}

// Unexpired returns s without the certificates whose NotAfter has passed
// at now, which no relying party may use: a bundle is never served with
// one (DESIGN.md "CA lifecycle"). s is not modified.
func (s Set) Unexpired(now time.Time) Set {
	keep := func(certs []*x509.Certificate) []*x509.Certificate {
		var out []*x509.Certificate
		for _, c := range certs {
			if !now.After(c.NotAfter) {
				out = append(out, c)
			}
		}
		return out
	}
	return Set{AuthorityID: s.AuthorityID, Roots: keep(s.Roots), Intermediates: keep(s.Intermediates), Cross: keep(s.Cross)}
}

// Expires is the earliest NotAfter of s's certificates (the zero time for
// an empty set): after it, s.Unexpired is a smaller set.
func (s Set) Expires() time.Time {
	var first time.Time
	for _, c := range s.All() {
		if first.IsZero() || c.NotAfter.Before(first) {
			first = c.NotAfter
		}
	}
	return first
}

// Digest is "sha256:" + hex of SHA-256 over the set's certificates in
// order, each prefixed by its kind and length, so two sets have the same
// digest only when they hold the same certificates in the same places.
func (s Set) Digest() string {
	h := sha256.New()
	for i, group := range [][]*x509.Certificate{s.Roots, s.Intermediates, s.Cross} {
		for _, c := range group {
			var pre [9]byte
			pre[0] = byte(i)
			binary.BigEndian.PutUint64(pre[1:], uint64(len(c.Raw)))
			h.Write(pre[:])
			h.Write(c.Raw)
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// CertFingerprint is "sha256:" + hex of SHA-256 of c's DER: how a
// heartbeat names each certificate an agent holds.
func CertFingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Fingerprints are the CertFingerprint of every certificate of s.
func (s Set) Fingerprints() []string {
	var out []string
	for _, c := range s.All() {
		out = append(out, CertFingerprint(c))
	}
	return out
}

// ParseDER parses the DER certificates of a bundle as it travels, refusing
// more than MaxCerts in all.
func ParseDER(authorityID string, roots, intermediates, cross [][]byte) (Set, error) {
	if n := len(roots) + len(intermediates) + len(cross); n > MaxCerts {
		return Set{}, fmt.Errorf("trust bundle: %d certificates, more than %d", n, MaxCerts)
	}
	s := Set{AuthorityID: authorityID}
	for _, g := range []struct {
		der  [][]byte
		to   *[]*x509.Certificate
		kind string
	}{{roots, &s.Roots, "root"}, {intermediates, &s.Intermediates, "intermediate"}, {cross, &s.Cross, "cross-certificate"}} {
		for _, d := range g.der {
			c, err := x509.ParseCertificate(d)
			if err != nil {
				return Set{}, fmt.Errorf("trust bundle: a %s: %v", g.kind, err)
			}
			*g.to = append(*g.to, c)
		}
	}
	return s, nil
}

// Taken is what Take decided about an offered set.
type Taken struct {
	// Set is what the agent holds now: the roots it trusts, and the
	// intermediates and cross-certificates of the offer that chain to
	// them.
	Set Set
	// NewRoots are roots trusted now that were not before (each through
	// a cross-certificate).
	NewRoots []*x509.Certificate
	// DroppedRoots are roots trusted before and not now.
	DroppedRoots []*x509.Certificate
	// Refused says, one line each, what of the offer was not taken and
	// why.
	Refused []string
}

// RootsChanged reports whether the trusted roots changed.
func (t Taken) RootsChanged() bool { return len(t.NewRoots) > 0 || len(t.DroppedRoots) > 0 }

// ErrOtherAuthority refuses a set offered for another authority.
var ErrOtherAuthority = errors.New("trust bundle: offered for another authority")

// Take decides what an agent that trusts held.Roots, and whose current
// certificate chain is current (leaf first; nil for none), holds after an
// authority offered offer at now. The rule (docs/ca-lifecycle.md, "What an
// agent holds"):
//
//   - A root stays trusted if the offer carries a root with its key (the
//     offered certificate replaces the held one if it is valid now).
//   - A root of the offer is trusted newly only through a
//     cross-certificate of the offer whose public key is that root's and
//     which verifies under a root trusted before this offer (held), is a
//     CA and is valid at now; the new root itself must be a self-signed CA
//     valid at now. One step only: a root trusted through this offer does
//     not vouch for another in the same offer.
//   - A held root the offer lacks is dropped, unless the current
//     certificate, still valid at now, chains to it (the agent could no
//     longer prove its own identity chain) or dropping it would leave no
//     root. It stays until the next offer after that certificate's
//     renewal.
//   - An intermediate is taken if it is a CA signed by a trusted root and
//     valid at now; a cross-certificate if it is signed by a trusted root.
//
// So an offer can never widen trust beyond what a trusted root vouched
// for, and can never leave the agent unable to verify its own
// certificate. Take never fails for a certificate it refuses (Refused
// says why); only an offer for another authority is refused whole.
func Take(held Set, current []*x509.Certificate, offer Set, now time.Time) (Taken, error) {
	if held.AuthorityID != "" && offer.AuthorityID != "" && held.AuthorityID != offer.AuthorityID {
		return Taken{}, fmt.Errorf("%w: %q, not %q", ErrOtherAuthority, offer.AuthorityID, held.AuthorityID)
	}
	var t Taken
	t.Set.AuthorityID = held.AuthorityID
	if t.Set.AuthorityID == "" {
		t.Set.AuthorityID = offer.AuthorityID
	}
	valid := func(c *x509.Certificate) bool { return !now.Before(c.NotBefore) && !now.After(c.NotAfter) }
	selfSignedCA := func(c *x509.Certificate) bool { return c.IsCA && c.CheckSignatureFrom(c) == nil }
	signedBy := func(c *x509.Certificate, roots []*x509.Certificate) bool {
		for _, r := range roots {
			if bytes.Equal(c.RawIssuer, r.RawSubject) && c.CheckSignatureFrom(r) == nil {
				return true
			}
		}
		return false
	}
	keyIn := func(c *x509.Certificate, set []*x509.Certificate) bool {
		for _, r := range set {
			if bytes.Equal(c.RawSubjectPublicKeyInfo, r.RawSubjectPublicKeyInfo) {
				return true
			}
		}
		return false
	}

	// Roots of the offer: kept (a held key) or new (through a
	// cross-certificate signed by a held root).
	var roots []*x509.Certificate
	for _, r := range offer.Roots {
		switch {
		case keyIn(r, roots):
			continue // a duplicate
		case !selfSignedCA(r):
			t.Refused = append(t.Refused, fmt.Sprintf("root %s: not a self-signed CA", r.Subject))
		case keyIn(r, held.Roots):
			// The same key (the pin): the offered certificate if it is
			// valid now (a root re-issued with the same key), else the
			// one held.
			if !valid(r) {
				r = sameKey(r, held.Roots)
			}
			roots = append(roots, r)
		case !valid(r):
			t.Refused = append(t.Refused, fmt.Sprintf("new root %s: not valid now", r.Subject))
		case vouched(r, offer.Cross, held.Roots, now):
			roots = append(roots, r)
			t.NewRoots = append(t.NewRoots, r)
		default:
			t.Refused = append(t.Refused, fmt.Sprintf("new root %s: no cross-certificate of its key signed by a trusted root", r.Subject))
		}
	}
	// Held roots the offer lacks.
	for _, r := range held.Roots {
		if keyIn(r, roots) {
			continue
		}
		switch {
		case len(roots) == 0:
			roots = append(roots, r) // never none
		case len(current) > 0 && valid(current[0]) && chainsTo(current, r):
			roots = append(roots, r)
			t.Refused = append(t.Refused, fmt.Sprintf("dropping root %s: kept while the current certificate (until %s) chains to it", r.Subject, current[0].NotAfter.UTC().Format(time.RFC3339)))
		default:
			t.DroppedRoots = append(t.DroppedRoots, r)
		}
	}
	t.Set.Roots = roots
	for _, c := range offer.Intermediates {
		switch {
		case !c.IsCA:
			t.Refused = append(t.Refused, fmt.Sprintf("intermediate %s: not a CA", c.Subject))
		case !valid(c):
			t.Refused = append(t.Refused, fmt.Sprintf("intermediate %s (serial %x): not valid now", c.Subject, c.SerialNumber))
		case !signedBy(c, roots):
			t.Refused = append(t.Refused, fmt.Sprintf("intermediate %s (serial %x): not signed by a trusted root", c.Subject, c.SerialNumber))
		default:
			t.Set.Intermediates = append(t.Set.Intermediates, c)
		}
	}
	for _, c := range offer.Cross {
		if c.IsCA && signedBy(c, roots) {
			t.Set.Cross = append(t.Set.Cross, c)
		} else {
			t.Refused = append(t.Refused, fmt.Sprintf("cross-certificate %s: not signed by a trusted root", c.Subject))
		}
	}
	return t, nil
}

// vouched reports whether a cross-certificate among cross certifies r's
// key under one of trusted, and is a CA valid at now.
func vouched(r *x509.Certificate, cross, trusted []*x509.Certificate, now time.Time) bool {
	for _, x := range cross {
		if !x.IsCA || now.Before(x.NotBefore) || now.After(x.NotAfter) ||
			!bytes.Equal(x.RawSubjectPublicKeyInfo, r.RawSubjectPublicKeyInfo) {
			continue
		}
		for _, t := range trusted {
			if bytes.Equal(x.RawIssuer, t.RawSubject) && x.CheckSignatureFrom(t) == nil {
				return true
			}
		}
	}
	return false
}

// sameKey is the certificate of set whose key is c's.
func sameKey(c *x509.Certificate, set []*x509.Certificate) *x509.Certificate {
	for _, r := range set {
		if bytes.Equal(c.RawSubjectPublicKeyInfo, r.RawSubjectPublicKeyInfo) {
			return r
		}
	}
	return c
}

// chainsTo reports whether chain (leaf first, then intermediates) ends
// at root: its last certificate is signed by root's key.
func chainsTo(chain []*x509.Certificate, root *x509.Certificate) bool {
	last := chain[len(chain)-1]
	if len(chain) == 1 && bytes.Equal(last.Raw, root.Raw) {
		return true
	}
	return last.CheckSignatureFrom(root) == nil
}
