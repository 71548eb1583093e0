package signer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
)

// Signers on the general custody read and write the references Sealed
// always has, so moving the keeper onto it keeps every stored key.
func TestInCustodyKeepsSealedReferences(t *testing.T) {
	ctx := context.Background()
	old, err := NewSealed(seal.StorageKey{1})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := custody.NewSealed(seal.StorageKey{1}, seal.InfoSigner, "muster-signer/")
	if err != nil {
		t.Fatal(err)
	}
	c := NewInCustody(custody.ByRef{New: sc, Sealed: sc})
	before, err := old.Generate(ctx, "v1")
	if err != nil {
		t.Fatal(err)
	}
	sig, err := c.Sign(ctx, "v1", before.Public, before.Ref, []byte("m"))
	if err != nil || !ed25519.Verify(before.Public, []byte("m"), sig) {
		t.Fatalf("a sealed signer's key through custody: %v", err)
	}
	after, err := c.Generate(ctx, "v2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Sign(ctx, "v2", after.Public, after.Ref, []byte("m")); err != nil {
		t.Fatalf("Sealed cannot read custody's reference: %v", err)
	}
	if _, err := c.Sign(ctx, "v1", after.Public, after.Ref, nil); !errors.Is(err, ErrCustody) {
		t.Fatalf("a reference moved to another version: %v, want ErrCustody", err)
	}
	if _, err := c.Sign(ctx, "v1", before.Public, []byte("pkcs11:token=x;object=muster-signer%2Fv1;id=%01"), nil); !errors.Is(err, custody.ErrNoToken) {
		t.Fatalf("a token reference without a token: %v, want ErrNoToken", err)
	}
}
