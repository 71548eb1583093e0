package custody

import (
	"context"
	"crypto"
	"errors"
)

// ErrNoToken: a key reference names a PKCS#11 object but the authority
// was started without a token.
var ErrNoToken = errors.New("custody: this key is in a PKCS#11 token, and no token is configured (authority.json custody, --pkcs11-module, PIN)")

// ByRef creates new keys with one custody and uses each existing key
// through the custody that made it, told by its reference: a pkcs11: URI
// is a token object, anything else is sealed. An authority moved to a
// token keeps using its sealed keys until they are rotated away.
type ByRef struct {
	// New makes new keys: the sealed custody or a token's.
	New Custody
	// Sealed opens sealed references.
	Sealed *Sealed
	// Token opens pkcs11: references; nil without a token.
	Token Custody
}

var _ Custody = ByRef{}

func (b ByRef) of(ref []byte) (Custody, error) {
	if IsPKCS11Ref(ref) {
		if b.Token == nil {
			return nil, ErrNoToken
		}
		return b.Token, nil
	}
	return b.Sealed, nil
}

// Create makes the key with New.
func (b ByRef) Create(ctx context.Context, name string, alg Algorithm) (Key, error) {
	return b.New.Create(ctx, name, alg)
}

// Signer opens the key with the custody its reference names.
func (b ByRef) Signer(ctx context.Context, name string, k Key) (crypto.Signer, error) {
	c, err := b.of(k.Ref)
	if err != nil {
		return nil, err
	}
	return c.Signer(ctx, name, k)
}

// Destroy removes the key with the custody its reference names.
func (b ByRef) Destroy(ctx context.Context, name string, k Key) error {
	c, err := b.of(k.Ref)
	if err != nil {
		return err
	}
	return c.Destroy(ctx, name, k)
}

// DestroyFound destroys the key with the custody its reference names,
// saying whether its private object was there.
func (b ByRef) DestroyFound(ctx context.Context, name string, k Key) (bool, error) {
	c, err := b.of(k.Ref)
	if err != nil {
		return false, err
	}
	return DestroyFound(ctx, c, name, k)
}

// Import seals key when New is the sealed custody; a token cannot take a
// key made outside it (its keys are generated inside).
func (b ByRef) Import(ctx context.Context, name string, key crypto.Signer) (Key, error) {
	imp, ok := b.New.(Importer)
	if !ok {
		return Key{}, errors.New("custody: keys in a PKCS#11 token are generated inside it; a key from a file cannot be imported")
	}
	return imp.Import(ctx, name, key)
}

// MakesHere reports whether ref names a key of the custody that makes new
// keys: a token object when New is the token, a sealed key otherwise. A
// key that is not (a sealed key on an authority moved to a token) is one
// to replace with a new key when its owner can do so on its own.
func (b ByRef) MakesHere(ref []byte) bool {
	inToken := b.Token != nil && b.New == b.Token
	return IsPKCS11Ref(ref) == inToken
}

// Where names where a reference's key lives, for operators: "sealed" or
// the token object's URI.
func Where(ref []byte) string {
	if IsPKCS11Ref(ref) {
		return string(ref)
	}
	return "sealed"
}
