package authority

import (
	"crypto/x509"
	"errors"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/crl"
	"github.com/muster-dev/muster/internal/store"
)

// TestRetiringListsServedInStandby: once a root rotation reaches standby,
// the intermediates muster init made (under the old root) are still
// retiring, as ca status says, and their leaves may still be held by a
// relying party that trusts the old root: each one's list is still signed
// by its own key and served, and listed in the metric. Once the
// intermediate is retired its list leaves both. Before, the list was a
// 404 from standby on while ca status showed the intermediate retiring.
func TestRetiringListsServedInStandby(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, func(c *Config) {
		fastCAClock(c)
		c.CRLURL = "http://crl.example:7445"
	})
	s := a.srvs[0]
	ctx := t.Context()
	old := s.ca.Issuer(ca.RoleAgent).Cert
	name := crl.Issuer{Role: string(ca.RoleAgent), Cert: old}.Name()
	if _, err := s.rotateRoot(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, _, err := s.stepRoot(ctx, "t", rootNext); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := s.caStep(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st, err := s.rootStatus(ctx); err != nil || st.Phase != store.RootPhaseStandby {
		t.Fatalf("root rotation: phase %s (%v), want standby", st.Phase, err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := a.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var row store.CACert
	for _, r := range rows {
		if r.Role == "agent" && string(r.CertDER) == string(old.Raw) {
			row = r
		}
	}
	if row.State != store.CARetiring {
		t.Fatalf("the init agent intermediate is %q in standby, want retiring", row.State)
	}
	if _, err := s.crl.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := s.crl.Get(ctx, name)
	if err != nil {
		t.Fatalf("the list of %s, retiring under the old root in standby: %v; want it served", name, err)
	}
	rl, err := x509.ParseRevocationList(c.DER)
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.CheckSignatureFrom(old); err != nil {
		t.Errorf("the list of %s is not signed by its intermediate: %v", name, err)
	}
	reported := func() bool {
		for _, st := range s.crl.Statuses() {
			if st.Issuer.Name() == name {
				return true
			}
		}
		return false
	}
	if !reported() {
		t.Errorf("the list of %s is served but has no status (muster_crl_next_update_seconds)", name)
	}

	if _, err := a.store.RetireCACert(ctx, "agent", row.Serial, setupLink); err != nil {
		t.Fatal(err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.crl.Get(ctx, name); !errors.Is(err, crl.ErrUnknownIssuer) {
		t.Errorf("the list of the retired %s: %v, want ErrUnknownIssuer (404)", name, err)
	}
	if reported() {
		t.Errorf("the retired %s's list is still reported", name)
	}
}
