package discovery

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// A registration's CA bundle across root rotations (DESIGN.md "CA
// lifecycle", "Root rotation"). The authority ID names the root muster
// init made, the **anchor**: discovery locks the ID to it (and its
// allow-list lists it), and the policy signing certificate is issued by
// it. A root rotation changes which roots agents pin, not the ID, so the
// bundle carries, in this order:
//
//  1. the anchor;
//  2. the roots agents may pin now, the one the authority signs with
//     first (the anchor again while it is still trusted); none when the
//     anchor is the only root, which is the bundle of an authority that
//     never rotated its root (and of every authority before this
//     layout);
//  3. the cross-certificates that link the anchor to each root of 2: each
//     certifies a root's key and is signed by the anchor's key or by a
//     key an earlier link certified.
//
// So a registration names a new root only through a cross-certificate
// that chains to the root the ID is locked to: whoever holds the policy
// signing key but no root key cannot point agents at a root of their own,
// and no registration moves the lock.

// Limits on a bundle's roots and links.
const (
	maxRoots = 4
	maxLinks = 16
)

// ErrRootNotLinked is a registration that names a root no
// cross-certificate in it links to the root the authority ID is locked to.
var ErrRootNotLinked = errors.New("discovery: registration: a root is not cross-certified by the root the authority ID names")

// Roots is a registration's CA bundle, parsed.
type Roots struct {
	// Anchor is the root the authority ID names.
	Anchor *x509.Certificate
	// Current is the roots agents may pin now, the signing one first;
	// the anchor alone when the bundle lists none.
	Current []*x509.Certificate
	// Links is the cross-certificates.
	Links []*x509.Certificate
}

// ParseRoots splits a CA bundle into anchor, current roots and links,
// checking only its structure: a self-signed CA first; after it,
// self-signed CAs (current roots), then CA certificates that are not
// self-signed (links).
func ParseRoots(bundlePEM string) (Roots, error) {
	certs, err := ca.ParseCertsPEM([]byte(bundlePEM))
	if err != nil || len(certs) == 0 {
		return Roots{}, fmt.Errorf("discovery: registration: ca_bundle_pem: want the root CA certificate first (%v)", err)
	}
	r := Roots{Anchor: certs[0]}
	if !selfSignedCA(r.Anchor) {
		return Roots{}, errors.New("discovery: registration: the first certificate of ca_bundle_pem is not a self-signed CA")
	}
	for _, c := range certs[1:] {
		switch {
		case !c.IsCA:
			return Roots{}, fmt.Errorf("discovery: registration: ca_bundle_pem: %q is not a CA certificate", c.Subject.CommonName)
		case selfSignedCA(c):
			if len(r.Links) > 0 {
				return Roots{}, errors.New("discovery: registration: ca_bundle_pem: the roots must come before the cross-certificates")
			}
			r.Current = append(r.Current, c)
		default:
			r.Links = append(r.Links, c)
		}
	}
	if len(r.Current) > maxRoots || len(r.Links) > maxLinks {
		return Roots{}, fmt.Errorf("discovery: registration: ca_bundle_pem: at most %d roots and %d cross-certificates", maxRoots, maxLinks)
	}
	if len(r.Current) == 0 {
		// Certificates after the anchor alone (intermediates, which
		// registrations could always carry) are checked as links: each
		// must verify under the anchor.
		r.Current = []*x509.Certificate{r.Anchor}
	}
	return r, nil
}

func selfSignedCA(c *x509.Certificate) bool { return c.IsCA && c.CheckSignatureFrom(c) == nil }

// Check verifies the links at now (with the clock allowance): every link
// is signed by the anchor's key or by a key another link certified, and is
// valid; every current root's key is the anchor's or certified by a link.
// A link that verifies under no such key fails the check too, so nothing
// unverified is stored and served.
func (r Roots) Check(now time.Time) error {
	reached, used := reach(r.Anchor, r.Links, now)
	for i, l := range r.Links {
		if !used[i] {
			return fmt.Errorf("%w: cross-certificate %q (serial %s) is not signed by a root linked to %s, or is not valid now",
				ErrRootNotLinked, l.Subject.CommonName, l.SerialNumber.Text(16), ca.Fingerprint(r.Anchor))
		}
	}
	for _, c := range r.Current {
		if _, ok := reached[string(c.RawSubjectPublicKeyInfo)]; !ok {
			return fmt.Errorf("%w: root %s is not linked to %s", ErrRootNotLinked, ca.Fingerprint(c), ca.Fingerprint(r.Anchor))
		}
		if !validAt(c, now) {
			return fmt.Errorf("discovery: registration: root %s is not valid now", ca.Fingerprint(c))
		}
	}
	return nil
}

// Fingerprints returns the fingerprints of the current roots, the signing
// one first.
func (r Roots) Fingerprints() []string {
	out := make([]string, len(r.Current))
	for i, c := range r.Current {
		out[i] = ca.Fingerprint(c)
	}
	return out
}

// validAt reports whether c is valid at now with the clock allowance.
func validAt(c *x509.Certificate, now time.Time) bool {
	return !now.Add(clockSkew).Before(c.NotBefore) && !now.Add(-clockSkew).After(c.NotAfter)
}

// reach walks links from the anchor: reached maps each key certified
// (the anchor's included) to the certificate that carries it and was
// reached first; used says which links verified.
func reach(anchor *x509.Certificate, links []*x509.Certificate, now time.Time) (reached map[string]*x509.Certificate, used []bool) {
	reached = map[string]*x509.Certificate{string(anchor.RawSubjectPublicKeyInfo): anchor}
	used = make([]bool, len(links))
	for progress := true; progress; {
		progress = false
		for i, l := range links {
			if used[i] || !validAt(l, now) {
				continue
			}
			for _, parent := range reached {
				if l.CheckSignatureFrom(parent) == nil {
					used[i] = true
					progress = true
					if _, ok := reached[string(l.RawSubjectPublicKeyInfo)]; !ok {
						reached[string(l.RawSubjectPublicKeyInfo)] = l
					}
					break
				}
			}
		}
	}
	return reached, used
}

// LinkRoots is the authority's side: the shortest cross-certificates,
// from candidates, that link anchor to every root of current, in an order
// Check accepts; an error naming a root no chain of candidates links.
func LinkRoots(anchor *x509.Certificate, current, candidates []*x509.Certificate, now time.Time) ([]*x509.Certificate, error) {
	// Breadth first, so each key is reached by its shortest chain.
	type hop struct {
		cert *x509.Certificate // the certificate carrying the key
		via  int               // index in candidates of its link; -1 for the anchor
		prev string            // the key that signed it
	}
	reached := map[string]hop{string(anchor.RawSubjectPublicKeyInfo): {cert: anchor, via: -1}}
	frontier := []string{string(anchor.RawSubjectPublicKeyInfo)}
	for len(frontier) > 0 {
		var next []string
		for _, k := range frontier {
			for i, c := range candidates {
				if _, ok := reached[string(c.RawSubjectPublicKeyInfo)]; ok || !c.IsCA || !validAt(c, now) {
					continue
				}
				if c.CheckSignatureFrom(reached[k].cert) == nil {
					reached[string(c.RawSubjectPublicKeyInfo)] = hop{cert: c, via: i, prev: k}
					next = append(next, string(c.RawSubjectPublicKeyInfo))
				}
			}
		}
		frontier = next
	}
	var out []*x509.Certificate
	seen := map[int]bool{}
	for _, root := range current {
		h, ok := reached[string(root.RawSubjectPublicKeyInfo)]
		if !ok {
			return nil, fmt.Errorf("%w: no cross-certificate links root %s to %s", ErrRootNotLinked, ca.Fingerprint(root), ca.Fingerprint(anchor))
		}
		var chain []*x509.Certificate
		for ; h.via >= 0; h = reached[h.prev] {
			if seen[h.via] {
				break
			}
			seen[h.via] = true
			chain = append([]*x509.Certificate{candidates[h.via]}, chain...)
		}
		out = append(out, chain...)
	}
	return out, nil
}
