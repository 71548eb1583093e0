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
	"time"

	"github.com/muster-dev/muster/internal/shellword"
)

// selfTestCallTimeout bounds each call the self-test makes into the
// custody. A PKCS#11 module that hangs (an HSM its client cannot reach,
// a session stuck inside the module) blocks in C, where no context stops
// it; the self-test stops waiting instead. Generous: a network HSM makes
// a key in seconds.
var selfTestCallTimeout = 30 * time.Second

// ErrHung: a call into the custody did not answer within its deadline.
// The call may still be running inside the module; nothing waits for it.
var ErrHung = errors.New("custody: the token's module did not answer")

// SelfTest makes a key of each algorithm muster signs with in c, signs
// with it, checks the signature and destroys the key again, so that a
// custody about to receive an authority's keys is known to work before
// anything names it (muster ca migrate-custody). Keys are named
// "selftest/" and a random suffix. Each call into c has its own deadline
// (selfTestCallTimeout): one that does not answer fails the self-test
// with ErrHung, naming the call and the way out, and no further call is
// made into a module that hangs.
func SelfTest(ctx context.Context, c Custody) error {
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	msg := []byte("muster custody self-test")
	digest := sha256.Sum256(msg)
	for _, alg := range []Algorithm{ECDSAP256, Ed25519} {
		name := "selftest/" + string(alg) + "-" + hex.EncodeToString(suffix)
		k, err := within(ctx, func(ctx context.Context) (Key, error) { return c.Create(ctx, name, alg) })
		if errors.Is(err, ErrHung) {
			return hung(c, "making the "+string(alg)+" test key "+name, listLeft(c, name))
		}
		if err != nil {
			return fmt.Errorf("custody self-test: creating a %s key: %w", alg, err)
		}
		left := func() string {
			if !IsPKCS11Ref(k.Ref) {
				return ""
			}
			return "its test key is left in the token: " + DeleteByHand(ModuleOf(c), k.Ref)
		}
		var what string // the call that hung, if one did
		err = func() error {
			s, err := within(ctx, func(ctx context.Context) (crypto.Signer, error) { return c.Signer(ctx, name, k) })
			if errors.Is(err, ErrHung) {
				what = "opening the " + string(alg) + " test key"
				return err
			}
			if err != nil {
				return fmt.Errorf("opening the %s key: %w", alg, err)
			}
			// crypto.Signer takes no context: the deadline is the
			// self-test's alone.
			sign := func(data []byte, opts crypto.SignerOpts) ([]byte, error) {
				sig, err := within(ctx, func(context.Context) ([]byte, error) { return s.Sign(rand.Reader, data, opts) })
				if errors.Is(err, ErrHung) {
					what = "signing with the " + string(alg) + " test key"
				}
				return sig, err
			}
			switch pub := k.Public.(type) {
			case *ecdsa.PublicKey:
				sig, err := sign(digest[:], crypto.SHA256)
				if err != nil {
					return fmt.Errorf("signing with the %s key: %w", alg, err)
				}
				if !ecdsa.VerifyASN1(pub, digest[:], sig) {
					return fmt.Errorf("the %s key's signature does not verify", alg)
				}
			case ed25519.PublicKey:
				sig, err := sign(msg, crypto.Hash(0))
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
		if what != "" {
			// The module hangs: destroying would most likely hang too.
			return hung(c, what, left())
		}
		_, derr := within(context.WithoutCancel(ctx), func(ctx context.Context) (struct{}, error) {
			return struct{}{}, c.Destroy(ctx, name, k)
		})
		if errors.Is(derr, ErrHung) {
			return hung(c, "destroying the "+string(alg)+" test key", left())
		}
		if derr != nil {
			derr = fmt.Errorf("destroying the %s test key: %w", alg, derr)
			if l := left(); l != "" {
				// Nothing else names the test key's object: the
				// operator is told how to delete it.
				derr = fmt.Errorf("%w; %s", derr, l)
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

// within runs fn with a deadline of selfTestCallTimeout and waits for it
// no longer: ErrHung when it has not answered by then (or answered that
// its own deadline passed, waiting for a session the hung call holds).
// ctx ending first is ctx's error.
func within[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, selfTestCallTimeout)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1) // a call answering late leaves without a reader
	go func() {
		v, err := fn(cctx)
		done <- result{v, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-cctx.Done():
		r.err = cctx.Err()
	}
	if r.err != nil && errors.Is(r.err, context.DeadlineExceeded) && ctx.Err() == nil && cctx.Err() != nil {
		return r.v, ErrHung
	}
	return r.v, r.err
}

// hung is the self-test's error for a call (what) the module did not
// answer within its deadline: what hung, that nothing changed, the
// command that shows whether the module answers, and left, what the
// operator deletes by hand ("" for nothing).
func hung(c Custody, what, left string) error {
	module := firstOf(ModuleOf(c), UnknownModule)
	explain := ""
	if module == UnknownModule {
		explain = " (" + UnknownModule + ": the token's PKCS#11 library, e.g. /usr/lib/softhsm/libsofthsm2.so)"
	}
	if left != "" {
		left = "; " + left
	}
	return fmt.Errorf("custody self-test: %s: %w within %s (the module %s hangs: an HSM its client cannot reach, a session stuck inside the module); "+
		"nothing changed. See whether the module answers, as this user and with this environment: `pkcs11-tool --module %s --list-token-slots`%s; "+
		"once it lists the token, run the same command again%s",
		what, ErrHung, selfTestCallTimeout, module, shellword.Quote(module), explain, left)
}

// listLeft is what may be left of the test key name whose making did
// not answer: an object the module may have made, which no reference
// names, found by its label with the token's listing.
func listLeft(c Custody, name string) string {
	t, ok := c.(interface{ TokenURI() string })
	if !ok {
		return ""
	}
	list := ListCommand(ModuleOf(c), t.TokenURI())
	if list == "" {
		return ""
	}
	return "a test key whose label ends in " + name + " may be left in the token: list its keys with `" + list +
		"` and delete that one's objects with the two commands docs/hsm.md \"Rollback\" shows (its --label and --id)"
}
