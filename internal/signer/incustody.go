package signer

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/muster-dev/muster/internal/custody"
)

// InCustody keeps signers' keys in the authority's key custody
// (internal/custody): new keys are made by it (sealed, or in a PKCS#11
// token), each existing one is used by the custody its reference names.
// Sealed references are those Sealed writes, so a store's existing
// signers keep working.
type InCustody struct {
	c custody.Custody

	mu sync.Mutex
	// tokens caches the signers of token objects: finding the object and
	// checking its attributes once per key, not per signature. Sealed keys
	// are opened per signature and wiped, as Sealed does.
	tokens map[string]crypto.Signer
}

var _ Custody = (*InCustody)(nil)

// NewInCustody returns the signers' custody over c; c names keys by the
// version ID they were generated under.
func NewInCustody(c custody.Custody) *InCustody {
	return &InCustody{c: c, tokens: map[string]crypto.Signer{}}
}

// Module is the PKCS#11 library of the token new keys are made in, ""
// when they are sealed.
func (c *InCustody) Module() string { return custody.ModuleOf(c.c) }

// Generate makes a new Ed25519 key for versionID.
func (c *InCustody) Generate(ctx context.Context, versionID string) (Key, error) {
	if err := ValidVersionID(versionID); err != nil {
		return Key{}, err
	}
	k, err := c.c.Create(ctx, versionID, custody.Ed25519)
	if err != nil {
		return Key{}, err
	}
	pub, ok := k.Public.(ed25519.PublicKey)
	if !ok {
		return Key{}, fmt.Errorf("signer: custody made a %T key, want Ed25519", k.Public)
	}
	return Key{Public: pub, Ref: k.Ref}, nil
}

// Destroy removes the key of versionID from custody (a token's objects;
// nothing for a sealed key, whose reference is the key).
func (c *InCustody) Destroy(ctx context.Context, versionID string, k Key) error {
	c.mu.Lock()
	for key := range c.tokens {
		if strings.HasPrefix(key, versionID+"\x00") {
			delete(c.tokens, key)
		}
	}
	c.mu.Unlock()
	return c.c.Destroy(ctx, versionID, custody.Key{Public: k.Public, Ref: k.Ref})
}

// Sign signs msg with the key of versionID.
func (c *InCustody) Sign(ctx context.Context, versionID string, pub ed25519.PublicKey, ref, msg []byte) ([]byte, error) {
	cacheKey := versionID + "\x00" + string(ref) + "\x00" + string(pub)
	token := custody.IsPKCS11Ref(ref)
	var s crypto.Signer
	if token {
		c.mu.Lock()
		s = c.tokens[cacheKey]
		c.mu.Unlock()
	}
	if s == nil {
		var err error
		s, err = c.c.Signer(ctx, versionID, custody.Key{Public: pub, Ref: ref})
		if errors.Is(err, custody.ErrKey) {
			return nil, ErrCustody
		}
		if err != nil {
			return nil, err
		}
		if token {
			c.mu.Lock()
			c.tokens[cacheKey] = s
			c.mu.Unlock()
		} else if k, ok := s.(ed25519.PrivateKey); ok {
			defer clear(k)
		}
	}
	return s.Sign(nil, msg, crypto.Hash(0))
}

// Where names where the key of a stored reference lives: "sealed" or the
// token object's pkcs11: URI.
func Where(ref []byte) string { return custody.Where(ref) }
