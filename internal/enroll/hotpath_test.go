package enroll

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"
	"unsafe"

	"github.com/muster-dev/muster/internal/ca"
)

// keyID is the SHA-256 of what x509.MarshalPKIXPublicKey writes, for the
// keys a CSR may carry and for others, so a key locked under its ID keeps
// it whichever way the ID was computed.
func TestKeyIDIsMarshalPKIX(t *testing.T) {
	var keys []crypto.PublicKey
	for range 64 {
		e, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		keys = append(keys, e.Public(), pub)
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	keys = append(keys, p384.Public())
	for i, k := range keys {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		want := sha256.Sum256(der)
		got, err := keyID(k)
		if err != nil || !bytes.Equal(got, want[:]) {
			t.Fatalf("key %d (%T): keyID %x, %v; want %x", i, k, got, err, want)
		}
	}
	if _, err := keyID(struct{}{}); err == nil {
		t.Fatal("keyID of no key: no error")
	}
}

// A join's or renewal's key ID takes no encoding/asn1 reflection: at most
// four allocations (the point's bytes, the sum) where MarshalPKIXPublicKey
// took 25.
func TestKeyIDAllocations(t *testing.T) {
	e, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	for _, k := range []crypto.PublicKey{e.Public(), pub} {
		if n := testing.AllocsPerRun(20, func() { keyID(k) }); n > 4 {
			t.Fatalf("%T: %v allocations, want at most 4", k, n)
		}
	}
}

// The roots' PEM is encoded once per root set: the same set answers from
// the kept encoding without allocating, a rotation's new set (other
// certificates) is encoded anew, and going back to the first set gives
// its roots again.
func TestRootsPEMKeptPerRootSet(t *testing.T) {
	h, err := ca.Create("roots", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	next, err := ca.Create("roots-next", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{CA: h}}
	want := func(roots ...*x509.Certificate) string {
		var out []byte
		for _, r := range roots {
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Raw})...)
		}
		return string(out)
	}
	if got := s.rootsPEM(); got != want(h.Root) {
		t.Fatalf("roots:\n%s", got)
	}
	// Roots itself may allocate the set it returns (before any rotation,
	// and under -race): count rootsPEM's own.
	read := testing.AllocsPerRun(20, func() { h.Roots() })
	if n := testing.AllocsPerRun(20, func() { s.rootsPEM() }); n != read {
		t.Fatalf("the same root set: %v allocations, want %v (Roots' own)", n, read)
	}
	// Every answer carries the kept string itself (the response's field
	// is a string): no answer copies the roots.
	first, second := s.rootsPEM(), s.rootsPEM()
	if unsafe.StringData(first) != unsafe.StringData(second) {
		t.Fatal("two answers of one root set carry two copies of its PEM")
	}
	h.SetRoots(&ca.RootSet{Trusted: []*x509.Certificate{next.Root, h.Root}, Signing: next.Root})
	if got := s.rootsPEM(); got != want(next.Root, h.Root) {
		t.Fatalf("during a rotation:\n%s", got)
	}
	h.SetRoots(&ca.RootSet{Trusted: []*x509.Certificate{h.Root}, Signing: h.Root})
	if got := s.rootsPEM(); got != want(h.Root) {
		t.Fatalf("after going back:\n%s", got)
	}
}
