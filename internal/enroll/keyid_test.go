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
	"testing"
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
