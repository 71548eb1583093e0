package signer

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"

	"github.com/muster-dev/muster/internal/seal"
)

// Key is what custody hands back for a new signer: the public key and an
// opaque reference the store keeps beside it. The reference is the sealed
// private key for Sealed custody, and would be a key name for a KMS or a
// PKCS#11 token; only the custody that made it can use it.
type Key struct {
	Public ed25519.PublicKey
	Ref    []byte
}

// Custody makes and uses signers' private keys; private material never
// leaves it. Implementations are safe for concurrent use.
type Custody interface {
	// Generate makes a new key for versionID.
	Generate(ctx context.Context, versionID string) (Key, error)
	// Sign signs msg with the key of versionID, given the public key and
	// reference stored for it. It returns ErrCustody when the reference does
	// not open to that public key.
	Sign(ctx context.Context, versionID string, pub ed25519.PublicKey, ref, msg []byte) ([]byte, error)
}

// ErrCustody is returned when a stored key reference does not produce the
// signer's key: a wrong storage key, a reference copied from another
// version, or tampering. The cases are not told apart.
var ErrCustody = errors.New("signer: the stored private key does not open for this version")

// Sealed keeps private keys in the store, encrypted with AES-256-GCM under
// the storage key's signer purpose (HKDF info muster-signer-encryption),
// bound to the version ID so a sealed key moved to another row does not
// open.
type Sealed struct{ sealer *seal.Sealer }

var _ Custody = (*Sealed)(nil)

// NewSealed returns the custody that seals keys under key.
func NewSealed(key seal.StorageKey) (*Sealed, error) {
	s, err := key.Sealer(seal.InfoSigner)
	if err != nil {
		return nil, err
	}
	return &Sealed{sealer: s}, nil
}

func aad(versionID string) []byte { return []byte("muster-signer/" + versionID) }

// Generate makes a fresh Ed25519 key and seals its seed. The reference is
// the nonce followed by the ciphertext.
func (c *Sealed) Generate(_ context.Context, versionID string) (Key, error) {
	if err := ValidVersionID(versionID); err != nil {
		return Key{}, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Key{}, err
	}
	seed := priv.Seed()
	defer clear(seed)
	defer clear(priv)
	ct, nonce, err := c.sealer.Seal(seed, aad(versionID))
	if err != nil {
		return Key{}, fmt.Errorf("signer: seal key: %w", err)
	}
	return Key{Public: pub, Ref: append(nonce, ct...)}, nil
}

// Sign opens the sealed seed, checks it is the key of pub, signs and wipes
// the private key.
func (c *Sealed) Sign(_ context.Context, versionID string, pub ed25519.PublicKey, ref, msg []byte) ([]byte, error) {
	const nonceSize = 12
	if len(ref) <= nonceSize {
		return nil, ErrCustody
	}
	seed, err := c.sealer.Open(ref[nonceSize:], ref[:nonceSize], aad(versionID))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, ErrCustody
	}
	defer clear(seed)
	priv := ed25519.NewKeyFromSeed(seed)
	defer clear(priv)
	if subtle.ConstantTimeCompare(priv.Public().(ed25519.PublicKey), pub) != 1 {
		return nil, ErrCustody
	}
	return ed25519.Sign(priv, msg), nil
}
