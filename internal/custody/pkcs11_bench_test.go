//go:build pkcs11 && cgo

package custody_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"testing"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
	"github.com/muster-dev/muster/internal/seal"
)

// BenchmarkSign is one signature of a CA intermediate's kind (ECDSA
// P-256, a SHA-256 digest) and of a signer's (Ed25519), by a sealed key
// and by a key in a SoftHSM2 token through the session pool, in parallel
// (docs/performance.md, "PKCS#11 custody beside sealed").
func BenchmarkSign(b *testing.B) {
	tok := softhsmtest.Start(b)
	tk, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: tok.PINFile})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tk.Close() })
	var sk seal.StorageKey
	copy(sk[:], "a storage key for the benchmark!")
	sealed, err := custody.NewSealedCA(sk)
	if err != nil {
		b.Fatal(err)
	}
	digest := sha256.Sum256([]byte("a certificate's to-be-signed bytes"))
	for _, c := range []struct {
		name string
		c    custody.Custody
	}{{"sealed", sealed}, {"pkcs11", tk.For("muster-bench/")}} {
		for _, alg := range []custody.Algorithm{custody.ECDSAP256, custody.Ed25519} {
			key, err := c.c.Create(context.Background(), "k-"+string(alg), alg)
			if err != nil {
				b.Fatal(err)
			}
			s, err := c.c.Signer(context.Background(), "k-"+string(alg), key)
			if err != nil {
				b.Fatal(err)
			}
			msg, opts := digest[:], crypto.SignerOpts(crypto.SHA256)
			if alg == custody.Ed25519 {
				msg, opts = []byte("a task envelope"), crypto.Hash(0)
			}
			b.Run(c.name+"/"+string(alg), func(b *testing.B) {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := s.Sign(rand.Reader, msg, opts); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
