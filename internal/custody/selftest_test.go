package custody_test

import (
	"context"
	"crypto"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
)

// hangs is a custody that stops answering at one call (stage "create",
// "open", "sign" or "destroy"), as a PKCS#11 module whose HSM its client
// cannot reach does, until release is closed; the call it hangs in is
// made first (a key made, then no answer), but for the destruction.
type hangs struct {
	custody.Custody
	stage   string
	release chan struct{}
}

func (h hangs) hang(stage string) {
	if stage == h.stage {
		<-h.release
	}
}

func (h hangs) Create(ctx context.Context, name string, alg custody.Algorithm) (custody.Key, error) {
	k, err := h.Custody.Create(ctx, name, alg)
	h.hang("create")
	return k, err
}

func (h hangs) Signer(ctx context.Context, name string, k custody.Key) (crypto.Signer, error) {
	s, err := h.Custody.Signer(ctx, name, k)
	h.hang("open")
	if err != nil {
		return nil, err
	}
	return hangingSigner{s, h}, nil
}

// Destroy hangs before it destroys anything: the key stays.
func (h hangs) Destroy(ctx context.Context, name string, k custody.Key) error {
	if h.stage == "destroy" {
		<-h.release
		return errors.New("released")
	}
	return h.Custody.Destroy(ctx, name, k)
}

func (h hangs) Module() string { return custody.ModuleOf(h.Custody) }

func (h hangs) TokenURI() string {
	if t, ok := h.Custody.(interface{ TokenURI() string }); ok {
		return t.TokenURI()
	}
	return ""
}

type hangingSigner struct {
	crypto.Signer
	h hangs
}

func (s hangingSigner) Sign(r io.Reader, data []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := s.Signer.Sign(r, data, opts)
	s.h.hang("sign")
	return sig, err
}

// TestSelfTestCallsHaveADeadline: a self-test whose custody stops
// answering at any of its calls (making, opening, signing with or
// destroying the test key) returns ErrHung once that call's deadline
// passes, naming the call that hung and the way out (the pkcs11-tool
// command that shows whether the module answers, the command run again).
// Before, the test key's destruction had no deadline at all (a
// context without cancel), and nothing stopped a module hanging in C.
func TestSelfTestCallsHaveADeadline(t *testing.T) {
	defer custody.SetSelfTestCallTimeout(time.Second)()
	sealed, err := custody.NewSealed(seal.StorageKey{7}, seal.InfoSigner, "muster-signer/")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ stage, what string }{
		{"create", "making the ecdsa-p256 test key selftest/ecdsa-p256-"},
		{"open", "opening the ecdsa-p256 test key"},
		{"sign", "signing with the ecdsa-p256 test key"},
		{"destroy", "destroying the ecdsa-p256 test key"},
	} {
		t.Run(tc.stage, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			done := make(chan error, 1)
			go func() { done <- custody.SelfTest(context.Background(), hangs{sealed, tc.stage, release}) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				t.Fatalf("SelfTest still waits for a custody that hangs in %s", tc.stage)
			}
			if !errors.Is(err, custody.ErrHung) {
				t.Fatalf("SelfTest = %v, want ErrHung", err)
			}
			for _, want := range []string{tc.what, "nothing changed", "`pkcs11-tool --module MODULE --list-token-slots`", "run the same command again"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("SelfTest = %v\ndoes not say %q", err, want)
				}
			}
		})
	}
	// A custody that answers passes, the deadline given to every call.
	if err := custody.SelfTest(context.Background(), sealed); err != nil {
		t.Fatalf("SelfTest of a sealed custody: %v", err)
	}
}
