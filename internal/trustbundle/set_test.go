package trustbundle

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"
)

var (
	t0     = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	serial int64
)

type kc struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// mint certifies key's public key as name, signed by parent (nil: self).
func mint(t *testing.T, name string, key *ecdsa.PrivateKey, parent *kc, isCA bool, from, to time.Time) *kc {
	t.Helper()
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: from, NotAfter: to, IsCA: isCA, BasicConstraintsValid: true}
	if isCA {
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	}
	issuer, signKey := tmpl, crypto.Signer(key)
	if parent != nil {
		issuer, signKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), signKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &kc{c, key}
}

type world struct {
	oldRoot, newRoot, otherRoot *kc
	oldInter, newInter          *kc
	leaf                        *kc // signed by oldInter
	crossNewByOld               *kc // newRoot's key, signed by oldRoot
	crossNewByOther             *kc // newRoot's key, signed by a root the agent does not trust
}

func newWorld(t *testing.T) world {
	from, to := t0.Add(-time.Hour), t0.Add(24*time.Hour)
	var w world
	w.oldRoot = mint(t, "old root", newKey(t), nil, true, from, to)
	nk := newKey(t)
	w.newRoot = mint(t, "new root", nk, nil, true, from, to)
	w.otherRoot = mint(t, "other root", newKey(t), nil, true, from, to)
	w.oldInter = mint(t, "old agent", newKey(t), w.oldRoot, true, from, to)
	w.newInter = mint(t, "new agent", newKey(t), w.newRoot, true, from, to)
	w.leaf = mint(t, "node", newKey(t), w.oldInter, false, from, t0.Add(time.Hour))
	w.crossNewByOld = mint(t, "new root", nk, w.oldRoot, true, from, to)
	w.crossNewByOther = mint(t, "new root", nk, w.otherRoot, true, from, to)
	return w
}

func certs(k ...*kc) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range k {
		out = append(out, c.cert)
	}
	return out
}

func names(cs []*x509.Certificate) string {
	var n []string
	for _, c := range cs {
		n = append(n, c.Subject.CommonName)
	}
	return strings.Join(n, ",")
}

func TestTakeIntermediatesOnlyUnderTrustedRoots(t *testing.T) {
	w := newWorld(t)
	held := Set{AuthorityID: "a", Roots: certs(w.oldRoot)}
	offer := Set{AuthorityID: "a", Roots: certs(w.oldRoot), Intermediates: certs(w.oldInter, w.newInter)}
	got, err := Take(held, certs(w.leaf, w.oldInter), offer, t0)
	if err != nil {
		t.Fatal(err)
	}
	if names(got.Set.Roots) != "old root" || names(got.Set.Intermediates) != "old agent" {
		t.Fatalf("held %s / %s, want old root / old agent", names(got.Set.Roots), names(got.Set.Intermediates))
	}
	if len(got.Refused) != 1 || !strings.Contains(got.Refused[0], "not signed by a trusted root") {
		t.Fatalf("refused %q", got.Refused)
	}
}

func TestTakeNewRootWithoutCrossCertificateIsRefused(t *testing.T) {
	w := newWorld(t)
	held := Set{AuthorityID: "a", Roots: certs(w.oldRoot)}
	// A bundle naming only a new root cannot replace the trusted one.
	offer := Set{AuthorityID: "a", Roots: certs(w.newRoot), Intermediates: certs(w.newInter)}
	got, err := Take(held, certs(w.leaf, w.oldInter), offer, t0)
	if err != nil {
		t.Fatal(err)
	}
	if names(got.Set.Roots) != "old root" || len(got.NewRoots) != 0 || len(got.Set.Intermediates) != 0 {
		t.Fatalf("roots %s new %d intermediates %d", names(got.Set.Roots), len(got.NewRoots), len(got.Set.Intermediates))
	}
}

func TestTakeNewRootThroughCrossCertificate(t *testing.T) {
	w := newWorld(t)
	held := Set{AuthorityID: "a", Roots: certs(w.oldRoot)}
	offer := Set{AuthorityID: "a", Roots: certs(w.oldRoot, w.newRoot), Intermediates: certs(w.oldInter, w.newInter),
		Cross: certs(w.crossNewByOld)}
	got, err := Take(held, certs(w.leaf, w.oldInter), offer, t0)
	if err != nil {
		t.Fatal(err)
	}
	if names(got.Set.Roots) != "old root,new root" || names(got.NewRoots) != "new root" {
		t.Fatalf("roots %s new %s", names(got.Set.Roots), names(got.NewRoots))
	}
	if names(got.Set.Intermediates) != "old agent,new agent" || len(got.Set.Cross) != 1 || len(got.Refused) != 0 {
		t.Fatalf("intermediates %s cross %d refused %q", names(got.Set.Intermediates), len(got.Set.Cross), got.Refused)
	}
}

func TestTakeCrossCertificateMustBeSignedByHeldRootAndMatchTheKey(t *testing.T) {
	w := newWorld(t)
	held := Set{AuthorityID: "a", Roots: certs(w.oldRoot)}
	// Signed by a root the agent does not trust.
	offer := Set{AuthorityID: "a", Roots: certs(w.oldRoot, w.newRoot), Cross: certs(w.crossNewByOther)}
	got, _ := Take(held, nil, offer, t0)
	if len(got.NewRoots) != 0 {
		t.Fatal("a cross-certificate from an untrusted root admitted a new root")
	}
	// Signed by the trusted root, but of another key than the new root's.
	otherKeyCross := mint(t, "new root", newKey(t), w.oldRoot, true, t0.Add(-time.Hour), t0.Add(time.Hour))
	offer = Set{AuthorityID: "a", Roots: certs(w.oldRoot, w.newRoot), Cross: certs(otherKeyCross)}
	if got, _ = Take(held, nil, offer, t0); len(got.NewRoots) != 0 {
		t.Fatal("a cross-certificate of another key admitted a new root")
	}
	// Expired cross-certificate.
	expired := mint(t, "new root", w.newRoot.key.(*ecdsa.PrivateKey), w.oldRoot, true, t0.Add(-2*time.Hour), t0.Add(-time.Hour))
	offer = Set{AuthorityID: "a", Roots: certs(w.oldRoot, w.newRoot), Cross: certs(expired)}
	if got, _ = Take(held, nil, offer, t0); len(got.NewRoots) != 0 {
		t.Fatal("an expired cross-certificate admitted a new root")
	}
	// A new root vouched for by another new root of the same offer (one
	// step only).
	third := newKey(t)
	thirdRoot := mint(t, "third root", third, nil, true, t0.Add(-time.Hour), t0.Add(time.Hour))
	crossThirdByNew := mint(t, "third root", third, w.newRoot, true, t0.Add(-time.Hour), t0.Add(time.Hour))
	offer = Set{AuthorityID: "a", Roots: certs(w.oldRoot, w.newRoot, thirdRoot), Cross: certs(w.crossNewByOld, crossThirdByNew)}
	got, _ = Take(held, nil, offer, t0)
	if names(got.NewRoots) != "new root" {
		t.Fatalf("new roots %s, want only the one a held root vouched for", names(got.NewRoots))
	}
}

func TestTakeKeepsTheRootTheCurrentCertificateChainsTo(t *testing.T) {
	w := newWorld(t)
	held := Set{AuthorityID: "a", Roots: certs(w.oldRoot, w.newRoot)}
	offer := Set{AuthorityID: "a", Roots: certs(w.newRoot), Intermediates: certs(w.newInter)}
	got, _ := Take(held, certs(w.leaf, w.oldInter), offer, t0)
	if names(got.Set.Roots) != "new root,old root" || len(got.DroppedRoots) != 0 {
		t.Fatalf("roots %s dropped %d: the current certificate's root must stay", names(got.Set.Roots), len(got.DroppedRoots))
	}
	// Once the certificate expired (or chains to the new root) it goes.
	got, _ = Take(held, certs(w.leaf, w.oldInter), offer, w.leaf.cert.NotAfter.Add(time.Second))
	if names(got.Set.Roots) != "new root" || names(got.DroppedRoots) != "old root" {
		t.Fatalf("roots %s dropped %s", names(got.Set.Roots), names(got.DroppedRoots))
	}
	newLeaf := mint(t, "node", newKey(t), w.newInter, false, t0.Add(-time.Minute), t0.Add(time.Hour))
	got, _ = Take(held, certs(newLeaf, w.newInter), offer, t0)
	if names(got.Set.Roots) != "new root" {
		t.Fatalf("roots %s", names(got.Set.Roots))
	}
}

func TestTakeNeverLeavesNoRoot(t *testing.T) {
	w := newWorld(t)
	held := Set{AuthorityID: "a", Roots: certs(w.oldRoot)}
	got, _ := Take(held, nil, Set{AuthorityID: "a"}, t0)
	if names(got.Set.Roots) != "old root" {
		t.Fatalf("roots %s", names(got.Set.Roots))
	}
}

func TestTakeRefusesAnotherAuthority(t *testing.T) {
	w := newWorld(t)
	if _, err := Take(Set{AuthorityID: "a", Roots: certs(w.oldRoot)}, nil, Set{AuthorityID: "b", Roots: certs(w.oldRoot)}, t0); err == nil {
		t.Fatal("took another authority's bundle")
	}
}

func TestDigestNamesContentAndPlace(t *testing.T) {
	w := newWorld(t)
	a := Set{Roots: certs(w.oldRoot), Intermediates: certs(w.oldInter)}
	b := Set{Roots: certs(w.oldRoot), Cross: certs(w.oldInter)}
	if a.Digest() == b.Digest() || a.Digest() != (Set{Roots: certs(w.oldRoot), Intermediates: certs(w.oldInter)}).Digest() {
		t.Fatal("digest does not follow content and place")
	}
}

func TestTakeKeepsTheHeldRootOverAnExpiredReissue(t *testing.T) {
	w := newWorld(t)
	expired := mint(t, "old root", w.oldRoot.key.(*ecdsa.PrivateKey), nil, true, t0.Add(-2*time.Hour), t0.Add(-time.Hour))
	reissued := mint(t, "old root", w.oldRoot.key.(*ecdsa.PrivateKey), nil, true, t0.Add(-time.Hour), t0.Add(48*time.Hour))
	held := Set{AuthorityID: "a", Roots: certs(w.oldRoot)}
	got, _ := Take(held, nil, Set{AuthorityID: "a", Roots: certs(expired)}, t0)
	if len(got.Set.Roots) != 1 || !got.Set.Roots[0].Equal(w.oldRoot.cert) || got.RootsChanged() {
		t.Fatal("an expired re-issue of the held root replaced it")
	}
	got, _ = Take(held, nil, Set{AuthorityID: "a", Roots: certs(reissued)}, t0)
	if len(got.Set.Roots) != 1 || !got.Set.Roots[0].Equal(reissued.cert) {
		t.Fatal("a valid re-issue of the held root (same key) was not taken")
	}
}

// TestUnexpired: a set at a time keeps each certificate until its
// NotAfter (inclusive, as x509 validity is) and drops it after; Expires is
// the first NotAfter, when the next drop happens.
func TestUnexpired(t *testing.T) {
	root := mint(t, "root", newKey(t), nil, true, t0, t0.Add(100*time.Hour))
	early := mint(t, "early", newKey(t), root, true, t0, t0.Add(time.Hour))
	late := mint(t, "late", newKey(t), root, true, t0, t0.Add(10*time.Hour))
	cross := mint(t, "cross", newKey(t), root, true, t0, t0.Add(5*time.Hour))
	set := Set{AuthorityID: "a", Roots: []*x509.Certificate{root.cert}, Intermediates: []*x509.Certificate{early.cert, late.cert},
		Cross: []*x509.Certificate{cross.cert}}
	if got := set.Expires(); !got.Equal(t0.Add(time.Hour)) {
		t.Fatalf("Expires = %v, want the early intermediate's NotAfter", got)
	}
	for _, c := range []struct {
		at                       time.Duration
		roots, intermediates, xs int
		expires                  time.Duration
	}{
		{0, 1, 2, 1, time.Hour},
		{time.Hour, 1, 2, 1, time.Hour},
		{time.Hour + time.Second, 1, 1, 1, 5 * time.Hour},
		{6 * time.Hour, 1, 1, 0, 10 * time.Hour},
		{101 * time.Hour, 0, 0, 0, 0},
	} {
		got := set.Unexpired(t0.Add(c.at))
		if len(got.Roots) != c.roots || len(got.Intermediates) != c.intermediates || len(got.Cross) != c.xs || got.AuthorityID != "a" {
			t.Errorf("at +%s: %d roots, %d intermediates, %d cross, authority %q; want %d, %d, %d", c.at,
				len(got.Roots), len(got.Intermediates), len(got.Cross), got.AuthorityID, c.roots, c.intermediates, c.xs)
		}
		if want := t0.Add(c.expires); c.expires == 0 && !got.Expires().IsZero() || c.expires != 0 && !got.Expires().Equal(want) {
			t.Errorf("at +%s: Expires = %v, want +%s", c.at, got.Expires(), c.expires)
		}
	}
	if len(set.Intermediates) != 2 {
		t.Fatal("Unexpired modified the set")
	}
}
