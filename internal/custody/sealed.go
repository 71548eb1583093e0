package custody

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"

	"github.com/muster-dev/muster/internal/seal"
)

// Sealed keeps each private key encrypted with AES-256-GCM under one
// purpose of the storage key (seal.InfoCA for CA keys), bound to the key's
// name as additional data. The reference is the nonce followed by the
// ciphertext of the key: an Ed25519 key as its 32-byte seed, any other as
// PKCS#8 DER. With purpose seal.InfoSigner and prefix "muster-signer/" the
// references are those signer.Sealed has always written.
type Sealed struct {
	sealer *seal.Sealer
	prefix string
}

var (
	_ Custody  = (*Sealed)(nil)
	_ Importer = (*Sealed)(nil)
)

// NewSealed returns the custody that seals keys under key's purpose info;
// the additional data of a key is prefix followed by its name.
func NewSealed(key seal.StorageKey, info, prefix string) (*Sealed, error) {
	s, err := key.Sealer(info)
	if err != nil {
		return nil, err
	}
	return &Sealed{sealer: s, prefix: prefix}, nil
}

// NewSealedWith returns the custody that seals keys with sealer (its
// purpose already chosen); the additional data of a key is prefix followed
// by its name.
func NewSealedWith(sealer *seal.Sealer, prefix string) *Sealed {
	return &Sealed{sealer: sealer, prefix: prefix}
}

// NewSealedCA returns the custody of the CA intermediates' keys (HKDF info
// muster-ca-encryption).
func NewSealedCA(key seal.StorageKey) (*Sealed, error) {
	return NewSealed(key, seal.InfoCA, "muster-ca/")
}

const nonceSize = 12

// Create makes a fresh key and seals it.
func (c *Sealed) Create(ctx context.Context, name string, alg Algorithm) (Key, error) {
	switch alg {
	case ECDSAP256:
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return Key{}, err
		}
		return c.Import(ctx, name, k)
	case Ed25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return Key{}, err
		}
		defer clear(k)
		return c.Import(ctx, name, k)
	}
	return Key{}, fmt.Errorf("%w: %q", ErrAlgorithm, alg)
}

// Import seals a key made elsewhere.
func (c *Sealed) Import(_ context.Context, name string, key crypto.Signer) (Key, error) {
	var plain []byte
	switch k := key.(type) {
	case ed25519.PrivateKey:
		plain = append([]byte(nil), k.Seed()...)
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return Key{}, fmt.Errorf("%w: ECDSA on %s", ErrAlgorithm, k.Curve.Params().Name)
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return Key{}, err
		}
		plain = der
	default:
		return Key{}, fmt.Errorf("%w: %T", ErrAlgorithm, key)
	}
	defer clear(plain)
	ct, nonce, err := c.sealer.Seal(plain, c.aad(name))
	if err != nil {
		return Key{}, fmt.Errorf("custody: seal key: %w", err)
	}
	return Key{Public: key.Public(), Ref: append(nonce, ct...)}, nil
}

// Signer opens the reference and checks it is the key of k.Public. The
// private key stays in memory as long as the signer is kept (a CA caches
// its active intermediate's signer).
func (c *Sealed) Signer(_ context.Context, name string, k Key) (crypto.Signer, error) {
	if len(k.Ref) <= nonceSize {
		return nil, ErrKey
	}
	plain, err := c.sealer.Open(k.Ref[nonceSize:], k.Ref[:nonceSize], c.aad(name))
	if err != nil {
		return nil, ErrKey
	}
	defer clear(plain)
	var s crypto.Signer
	if len(plain) == ed25519.SeedSize {
		s = ed25519.NewKeyFromSeed(plain)
	} else {
		parsed, err := x509.ParsePKCS8PrivateKey(plain)
		if err != nil {
			return nil, ErrKey
		}
		ps, ok := parsed.(crypto.Signer)
		if !ok {
			return nil, ErrKey
		}
		s = ps
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := s.Public().(equaler); !ok || !pub.Equal(k.Public) {
		return nil, ErrKey
	}
	return s, nil
}

// Destroy has nothing to do: the reference is the key.
func (c *Sealed) Destroy(context.Context, string, Key) error { return nil }

func (c *Sealed) aad(name string) []byte { return []byte(c.prefix + name) }
