package authority

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
)

// losingRoots is CA custody that, once lost is set, answers for every
// root's key as a token does that no longer holds the object.
type losingRoots struct {
	custody.Custody
	lost *atomic.Bool
}

func (l losingRoots) Signer(ctx context.Context, name string, k custody.Key) (crypto.Signer, error) {
	if l.lost.Load() && strings.HasPrefix(name, "root/") {
		return nil, fmt.Errorf("%w: pkcs11:token=muster;object=muster-ca%%2F%s", custody.ErrKeyMissing, name)
	}
	return l.Custody.Signer(ctx, name, k)
}

func (l losingRoots) Import(ctx context.Context, name string, key crypto.Signer) (custody.Key, error) {
	return l.Custody.(custody.Importer).Import(ctx, name, key)
}

// readAsAtStart reads the store's intermediates as a starting replica
// does: no key opened before.
func readAsAtStart(t *testing.T, s *Server) error {
	t.Helper()
	in, err := newIntermediates(s)
	if err != nil {
		t.Fatal(err)
	}
	return in.load(t.Context())
}

// TestRootKeyMissingNamesTheWayOut: a root whose key custody no longer
// holds (a root rotation's new root, its key in a token that lost it)
// stops a replica reading the store's CA, as at its start, with the root
// named and what the operator can do: restore the token, or, the key lost
// for good, a new authority. It said only that an object was missing.
func TestRootKeyMissingNamesTheWayOut(t *testing.T) {
	var lost atomic.Bool
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) {
		c.WrapCACustody = func(inner custody.Custody) (custody.Custody, error) {
			return losingRoots{Custody: inner, lost: &lost}, nil
		}
	})
	s := a.srvs[0]
	st, err := s.rotateRoot(t.Context(), "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	lost.Store(true)
	err = readAsAtStart(t, s)
	if !errors.Is(err, custody.ErrKeyMissing) {
		t.Fatalf("reading the CA with the new root's key gone: %v, want ErrKeyMissing", err)
	}
	for _, want := range []string{"the stored new root: " + ca.Fingerprint(st.New), "object=muster-ca%2Froot/",
		"restore the token from its backup", "muster init --data NEWDIR", `docs/hsm.md "A lost token"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
}
