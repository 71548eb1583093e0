package custody_test

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
)

func storageKey(t *testing.T, b byte) seal.StorageKey {
	t.Helper()
	var k seal.StorageKey
	for i := range k {
		k[i] = b
	}
	return k
}

func TestSealedCreateSignLookUp(t *testing.T) {
	ctx := context.Background()
	c, err := custody.NewSealedCA(storageKey(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []custody.Algorithm{custody.ECDSAP256, custody.Ed25519} {
		t.Run(string(alg), func(t *testing.T) {
			k, err := c.Create(ctx, "ca/agent/01", alg)
			if err != nil {
				t.Fatal(err)
			}
			s, err := c.Signer(ctx, "ca/agent/01", k)
			if err != nil {
				t.Fatal(err)
			}
			msg := []byte("muster")
			digest, opts := msg, crypto.SignerOpts(crypto.Hash(0))
			if alg == custody.ECDSAP256 {
				sum := sha256.Sum256(msg)
				digest, opts = sum[:], crypto.SHA256
			}
			sig, err := s.Sign(rand.Reader, digest, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(sig) == 0 {
				t.Fatal("empty signature")
			}
			if err := c.Destroy(ctx, "ca/agent/01", k); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSealedRefusesAMovedOrForeignReference(t *testing.T) {
	ctx := context.Background()
	c, _ := custody.NewSealedCA(storageKey(t, 1))
	other, _ := custody.NewSealedCA(storageKey(t, 2))
	signers, _ := custody.NewSealed(storageKey(t, 1), seal.InfoSigner, "muster-ca/")
	k, err := c.Create(ctx, "ca/server/aa", custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := c.Create(ctx, "ca/server/bb", custody.ECDSAP256)
	tampered := append([]byte(nil), k.Ref...)
	tampered[len(tampered)-1] ^= 1
	for name, try := range map[string]func() error{
		"another name":        func() error { _, err := c.Signer(ctx, "ca/server/bb", k); return err },
		"another storage key": func() error { _, err := other.Signer(ctx, "ca/server/aa", k); return err },
		"another purpose":     func() error { _, err := signers.Signer(ctx, "ca/server/aa", k); return err },
		"another public key": func() error {
			_, err := c.Signer(ctx, "ca/server/aa", custody.Key{Public: k2.Public, Ref: k.Ref})
			return err
		},
		"tampered": func() error {
			_, err := c.Signer(ctx, "ca/server/aa", custody.Key{Public: k.Public, Ref: tampered})
			return err
		},
		"short": func() error {
			_, err := c.Signer(ctx, "ca/server/aa", custody.Key{Public: k.Public, Ref: k.Ref[:5]})
			return err
		},
	} {
		if err := try(); !errors.Is(err, custody.ErrKey) {
			t.Errorf("%s: got %v, want ErrKey", name, err)
		}
	}
	if _, err := c.Create(ctx, "x", custody.Algorithm("rsa")); !errors.Is(err, custody.ErrAlgorithm) {
		t.Errorf("rsa: got %v, want ErrAlgorithm", err)
	}
}

// The task signers' sealed references are this custody's with the signer
// purpose and prefix, so moving signers behind custody keeps every key
// already stored.
func TestSealedReadsTaskSignerReferences(t *testing.T) {
	ctx := context.Background()
	key := storageKey(t, 3)
	old, err := signer.NewSealed(key)
	if err != nil {
		t.Fatal(err)
	}
	sk, err := old.Generate(ctx, "v1")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := custody.NewSealed(key, seal.InfoSigner, "muster-signer/")
	s, err := c.Signer(ctx, "v1", custody.Key{Public: sk.Public, Ref: sk.Ref})
	if err != nil {
		t.Fatal(err)
	}
	sig, err := s.Sign(rand.Reader, []byte("task"), crypto.Hash(0))
	if err != nil || !ed25519.Verify(sk.Public, []byte("task"), sig) {
		t.Fatalf("signature by the custody does not verify: %v", err)
	}
	// And the other way round.
	k, _ := c.Create(ctx, "v2", custody.Ed25519)
	want, _ := old.Sign(ctx, "v2", k.Public.(ed25519.PublicKey), k.Ref, []byte("task"))
	if !ed25519.Verify(k.Public.(ed25519.PublicKey), []byte("task"), want) {
		t.Fatal("signer.Sealed cannot use a custody reference")
	}
}
