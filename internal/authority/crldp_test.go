package authority

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/crl"
)

// TestLeavesNameTheirIssuersList: with --crl-url, a leaf signed by the
// intermediate every signer uses names that intermediate's list in its
// CRL Distribution Points, for every role, and after a rotation the new
// intermediate's leaves name the new list.
func TestLeavesNameTheirIssuersList(t *testing.T) {
	const base = "http://crl.example:7445"
	a := startReplicas(t, nil, 1, func(c *Config) { c.CRLURL = base })
	ctx := t.Context()
	s := a.srvs[0]
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	check := func(role ca.Role) string {
		t.Helper()
		is := s.ca.Issuer(role)
		leaf, err := is.Issue(ca.LeafRequest{PublicKey: key.Public(), CommonName: "leaf", ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		want := crl.DistributionPoint(base, crl.Issuer{Role: string(role), Cert: is.Cert})
		if !slices.Equal(leaf.CRLDistributionPoints, []string{want}) {
			t.Fatalf("a %s leaf names %q, want its issuer's list %q", role, leaf.CRLDistributionPoints, want)
		}
		return want
	}
	for _, role := range caRoles {
		check(role)
	}
	before := check(ca.RoleAgent)
	row, err := s.inter.prepare(ctx, ca.RoleAgent, a.h.RootKey, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.store.ActivateCACert(ctx, "agent", row.Serial, setupLink); err != nil {
		t.Fatal(err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	if after := check(ca.RoleAgent); after == before {
		t.Fatalf("after the rotation agent leaves still name %s", before)
	}
}
