package signer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/muster-dev/muster/internal/seal"
)

func TestSealedCustody(t *testing.T) {
	ctx := context.Background()
	c, err := NewSealed(seal.StorageKey{1})
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.Generate(ctx, "v1")
	if err != nil {
		t.Fatal(err)
	}
	sig, err := c.Sign(ctx, "v1", k.Public, k.Ref, []byte("msg"))
	if err != nil {
		t.Fatal(err)
	}
	if !ed25519.Verify(k.Public, []byte("msg"), sig) {
		t.Fatal("signature does not verify")
	}
	other, _ := c.Generate(ctx, "v2")
	otherKey, _ := NewSealed(seal.StorageKey{2})
	tampered := append([]byte(nil), k.Ref...)
	tampered[len(tampered)-1] ^= 1
	for name, sign := range map[string]func() ([]byte, error){
		"other version's row": func() ([]byte, error) { return c.Sign(ctx, "v2", k.Public, k.Ref, nil) },
		"other public key":    func() ([]byte, error) { return c.Sign(ctx, "v1", other.Public, k.Ref, nil) },
		"other storage key":   func() ([]byte, error) { return otherKey.Sign(ctx, "v1", k.Public, k.Ref, nil) },
		"tampered":            func() ([]byte, error) { return c.Sign(ctx, "v1", k.Public, tampered, nil) },
		"truncated":           func() ([]byte, error) { return c.Sign(ctx, "v1", k.Public, k.Ref[:5], nil) },
	} {
		if _, err := sign(); !errors.Is(err, ErrCustody) {
			t.Errorf("%s: %v, want ErrCustody", name, err)
		}
	}
	if _, err := c.Generate(ctx, "Bad ID"); err == nil {
		t.Error("malformed version ID accepted")
	}
}
