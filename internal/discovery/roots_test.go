package discovery

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// newTestRoot is a root like a root rotation's new one.
func newTestRoot(t *testing.T, name string, now time.Time) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := ca.NewSerial()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ca.NewRoot(name, serial, key, now)
	if err != nil {
		t.Fatal(err)
	}
	return root, key
}

func crossSign(t *testing.T, subject, issuer *x509.Certificate, key crypto.Signer, now time.Time) *x509.Certificate {
	t.Helper()
	c, err := ca.CrossSign(subject, issuer, key, now)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRegistrationAcrossRootRotations: a registration names a root other
// than the one its authority ID is locked to only through
// cross-certificates chaining to that root; the authority's side
// (LinkRoots) finds them across two rotations.
func TestRegistrationAcrossRootRotations(t *testing.T) {
	h, _ := testHierarchies(t)
	now := time.Now()
	b := h.Root
	r1, k1 := newTestRoot(t, "prod", now)
	r2, _ := newTestRoot(t, "prod", now)
	r1ByB := crossSign(t, r1, b, h.RootKey, now)
	bByR1 := crossSign(t, b, r1, k1, now)
	r2ByR1 := crossSign(t, r2, r1, k1, now)
	stranger, strangerKey := newTestRoot(t, "prod", now)
	r2ByStranger := crossSign(t, r2, stranger, strangerKey, now)

	register := func(bundle string) error {
		t.Helper()
		reg := validRegistration(t, h)
		reg.CABundlePEM = bundle
		_, err := reg.VerifyAt(signRegistration(t, reg, h.Issuer(ca.RolePolicy).Key), now)
		return err
	}
	for name, bundle := range map[string]string{
		"no rotation":                 pemOf(b),
		"init: both roots, old first": pemOf(b, b, r1, r1ByB, bByR1),
		"update_servers: new first":   pemOf(b, r1, b, r1ByB, bByR1),
		"standby":                     pemOf(b, r1, r1ByB),
		"second rotation, init":       pemOf(b, r1, r2, r1ByB, r2ByR1),
		"second rotation, standby":    pemOf(b, r2, r2ByR1, r1ByB), // order of links free
	} {
		if err := register(bundle); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		roots, err := ParseRoots(bundle)
		if err != nil || roots.Anchor != nil && ca.Fingerprint(roots.Anchor) != h.Fingerprint() {
			t.Errorf("%s: ParseRoots: %v", name, err)
		}
	}
	if roots, _ := ParseRoots(pemOf(b, r1, b, r1ByB)); !slices.Equal(roots.Fingerprints(), []string{ca.Fingerprint(r1), h.Fingerprint()}) {
		t.Errorf("current roots %v; want the signing root first", roots.Fingerprints())
	}
	if roots, _ := ParseRoots(pemOf(b)); !slices.Equal(roots.Fingerprints(), []string{h.Fingerprint()}) {
		t.Errorf("current roots of a bundle of one root: %v", roots.Fingerprints())
	}

	for name, bundle := range map[string]string{
		"a root with no link":                pemOf(b, stranger),
		"a root linked by another root":      pemOf(b, r2, r2ByStranger),
		"a link from a root not linked":      pemOf(b, r2, r2ByR1), // r1 itself is not linked to b
		"a link that verifies under no key":  pemOf(b, r1, r1ByB, r2ByStranger),
		"the link reversed":                  pemOf(b, r1, bByR1),
		"a link from another root, no roots": pemOf(b, r2ByStranger),
	} {
		if err := register(bundle); !errors.Is(err, ErrRootNotLinked) {
			t.Errorf("%s: %v; want ErrRootNotLinked", name, err)
		}
	}
	// An expired link vouches for nothing.
	old := now.Add(-48 * time.Hour)
	r3, _ := newTestRoot(t, "prod", old)
	expired, err := ca.CrossSign(r3, b, h.RootKey, old)
	if err != nil {
		t.Fatal(err)
	}
	if err := (Roots{Anchor: b, Current: []*x509.Certificate{r3}, Links: []*x509.Certificate{expired}}).Check(expired.NotAfter.Add(time.Hour)); !errors.Is(err, ErrRootNotLinked) {
		t.Errorf("an expired link: %v", err)
	}
	// Structure: cross-certificates before the roots they link are
	// malformed.
	for name, bundle := range map[string]string{
		"links before roots": pemOf(b, r1ByB, r1),
	} {
		if _, err := ParseRoots(bundle); err == nil || errors.Is(err, ErrRootNotLinked) {
			t.Errorf("%s: %v; want a malformed bundle", name, err)
		}
	}

	// The authority's side: the links of the rotation in progress and
	// those discovery holds, the shortest chain to each trusted root.
	links, err := LinkRoots(b, []*x509.Certificate{r2, r1}, []*x509.Certificate{r2ByR1, bByR1, r2ByStranger, r1ByB}, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 2 || !slices.ContainsFunc(links, r1ByB.Equal) || !slices.ContainsFunc(links, r2ByR1.Equal) {
		t.Errorf("LinkRoots: %d links; want r1 by b and r2 by r1", len(links))
	}
	if err := (Roots{Anchor: b, Current: []*x509.Certificate{r2, r1}, Links: links}).Check(now); err != nil {
		t.Errorf("Check of LinkRoots' answer: %v", err)
	}
	if _, err := LinkRoots(b, []*x509.Certificate{r2}, []*x509.Certificate{r2ByR1}, now); !errors.Is(err, ErrRootNotLinked) {
		t.Errorf("LinkRoots without the first rotation's link: %v", err)
	}
	if links, err := LinkRoots(b, []*x509.Certificate{b, r1}, []*x509.Certificate{bByR1, r1ByB}, now); err != nil || len(links) != 1 || !links[0].Equal(r1ByB) {
		t.Errorf("LinkRoots in init: %v, %d links", err, len(links))
	}
}
