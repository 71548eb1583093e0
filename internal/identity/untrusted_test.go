package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// TestUntrustedRootErrorOnlyForAnUnknownRoot: VerifyPeer's typed
// *UntrustedRootError, for which the agent and the CLI name a join or a
// new identity pinned to the current root, is the refusal of a chain to
// no root held, and only that one. A certificate under the pinned root
// that is expired (or not yet valid: a clock off) or not for the usage
// asked fails otherwise: a new join would not help it. They all were
// typed untrusted, and the hint told the operator to join again.
func TestUntrustedRootErrorOnlyForAnUnknownRoot(t *testing.T) {
	now := time.Now()
	h, err := ca.Create("pinned", now)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Create("other", now)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffeid.New("td", spiffeid.RoleAuthority, "td")
	leaf := func(h *ca.Hierarchy, serverAuth bool) []*x509.Certificate {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		c, err := h.Issuer(ca.RoleServer).Issue(ca.LeafRequest{PublicKey: key.Public(), SPIFFEID: id.URL(),
			ServerAuth: serverAuth, ClientAuth: !serverAuth, NotBefore: now, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{c, h.Issuer(ca.RoleServer).Cert}
	}
	for _, c := range []struct {
		name      string
		chain     []*x509.Certificate
		at        time.Time
		untrusted bool
	}{
		{"under a root not held", leaf(other, true), now, true},
		{"expired under the pinned root", leaf(h, true), now.Add(2 * time.Hour), false},
		{"not yet valid under the pinned root", leaf(h, true), now.Add(-time.Hour), false},
		{"not for server authentication", leaf(h, false), now, false},
	} {
		err := VerifyPeer(c.chain, h.RootPool(), MatchID(id), x509.ExtKeyUsageServerAuth, c.at)
		if err == nil {
			t.Errorf("%s: verified", c.name)
			continue
		}
		var untrusted *UntrustedRootError
		if got := errors.As(err, &untrusted); got != c.untrusted {
			t.Errorf("%s: %v; typed untrusted root %v, want %v", c.name, err, got, c.untrusted)
		}
	}
}
