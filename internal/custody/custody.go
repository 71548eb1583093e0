// Package custody holds the private keys the authority signs with behind
// one small interface (DESIGN.md "CA lifecycle, revocation and key
// custody", "Key custody"): create a key, look it up as a crypto.Signer,
// destroy it. Callers keep only the public key and an opaque reference,
// which the store holds beside the key's record; only the custody that made
// a reference can use it.
//
// Sealed keeps the key encrypted in the reference itself (the store holds
// the ciphertext); a PKCS#11 custody would keep the key in a token and the
// reference would name the object. Both give the same crypto.Signer, so the
// CA and the task signers never see which one holds their keys.
package custody

import (
	"context"
	"crypto"
	"errors"
)

// Algorithm is the kind of key to create.
type Algorithm string

// The algorithms muster signs with: ECDSA P-256 for certificates, Ed25519
// for task signers.
const (
	ECDSAP256 Algorithm = "ecdsa-p256"
	Ed25519   Algorithm = "ed25519"
)

// Key is what custody hands back for a key: its public half and the
// reference the caller stores with it.
type Key struct {
	Public crypto.PublicKey
	Ref    []byte
}

// Custody makes and uses private keys; the private material never leaves
// it. Every key has a name (the row it belongs to, e.g. "ca/agent/SERIAL"
// or a signer version ID) that binds its reference: a reference moved to
// another name does not open. Implementations are safe for concurrent use.
type Custody interface {
	// Create makes a new key of alg for name.
	Create(ctx context.Context, name string, alg Algorithm) (Key, error)
	// Signer looks up the key of name given what Create returned for it.
	// It returns ErrKey when the reference does not produce that public
	// key (a wrong storage key, a reference of another name, tampering).
	Signer(ctx context.Context, name string, k Key) (crypto.Signer, error)
	// Destroy removes the key of name. For Sealed it has nothing to do:
	// the reference is the key, and goes with the caller's row.
	Destroy(ctx context.Context, name string, k Key) error
}

// Importer is the optional ability to take a key made outside custody
// (an authority upgraded from intermediates kept in files). A custody that
// cannot import (an HSM whose keys are generated inside) lacks it, and the
// caller makes a new key through the rotation machinery instead.
type Importer interface {
	Import(ctx context.Context, name string, key crypto.Signer) (Key, error)
}

// FoundDestroyer is the optional ability to say, while destroying a key,
// whether its private object was there to destroy (a PKCS#11 token's may
// have been deleted by hand or lost with a restore).
type FoundDestroyer interface {
	DestroyFound(ctx context.Context, name string, k Key) (found bool, err error)
}

// DestroyFound destroys the key of name with c and reports whether its
// private half was there; a custody that cannot tell (a sealed key is its
// reference) says it was.
func DestroyFound(ctx context.Context, c Custody, name string, k Key) (bool, error) {
	if f, ok := c.(FoundDestroyer); ok {
		return f.DestroyFound(ctx, name, k)
	}
	return true, c.Destroy(ctx, name, k)
}

// ErrKey: a stored reference does not produce the key it is stored for.
// The cases are deliberately not told apart.
var ErrKey = errors.New("custody: the stored key reference does not open to its public key")

// ErrKeyMissing: the token answers but holds no private key object for
// the reference (deleted, or a token restored or replaced without it).
// Unlike ErrKey it tells the operator what to do: the key is gone, so
// whatever signs with it must be replaced (docs/hsm.md "A lost token").
var ErrKeyMissing = errors.New("custody: the key's private object is not in the PKCS#11 token")

// ErrAlgorithm: the custody cannot make or hold a key of that kind.
var ErrAlgorithm = errors.New("custody: key algorithm not supported")
