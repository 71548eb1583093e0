package custody

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// SelfTest makes a key of each algorithm muster signs with in c, signs
// with it, checks the signature and destroys the key again, so that a
// custody about to receive an authority's keys is known to work before
// anything names it (muster ca migrate-custody). Keys are named
// "selftest/" and a random suffix.
func SelfTest(ctx context.Context, c Custody) error {
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	msg := []byte("muster custody self-test")
	digest := sha256.Sum256(msg)
	for _, alg := range []Algorithm{ECDSAP256, Ed25519} {
		name := "selftest/" + string(alg) + "-" + hex.EncodeToString(suffix)
		k, err := c.Create(ctx, name, alg)
		if err != nil {
			return fmt.Errorf("custody self-test: creating a %s key: %w", alg, err)
		}
		err = func() error {
			s, err := c.Signer(ctx, name, k)
			if err != nil {
				return fmt.Errorf("opening the %s key: %w", alg, err)
			}
			switch pub := k.Public.(type) {
			case *ecdsa.PublicKey:
				sig, err := s.Sign(rand.Reader, digest[:], crypto.SHA256)
				if err != nil {
					return fmt.Errorf("signing with the %s key: %w", alg, err)
				}
				if !ecdsa.VerifyASN1(pub, digest[:], sig) {
					return fmt.Errorf("the %s key's signature does not verify", alg)
				}
			case ed25519.PublicKey:
				sig, err := s.Sign(rand.Reader, msg, crypto.Hash(0))
				if err != nil {
					return fmt.Errorf("signing with the %s key: %w", alg, err)
				}
				if !ed25519.Verify(pub, msg, sig) {
					return fmt.Errorf("the %s key's signature does not verify", alg)
				}
			default:
				return fmt.Errorf("%w: %T", ErrAlgorithm, k.Public)
			}
			return nil
		}()
		derr := c.Destroy(context.WithoutCancel(ctx), name, k)
		if derr != nil {
			derr = fmt.Errorf("destroying the %s test key: %w", alg, derr)
			if IsPKCS11Ref(k.Ref) {
				// Nothing else names the test key's object: the
				// operator is told how to delete it.
				derr = fmt.Errorf("%w; %s", derr, DeleteByHand(ModuleOf(c), k.Ref))
			}
		}
		if err != nil {
			return fmt.Errorf("custody self-test: %w", errors.Join(err, derr))
		}
		if derr != nil {
			return fmt.Errorf("custody self-test: %w", derr)
		}
	}
	return nil
}
