package authority

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// TestExportedRootKeyIsOffline: once a finished rotation's root key is
// taken from the store (muster ca root export-key clears it), the replica
// reads its roots without opening a key, holds no signing root key, and
// warns before a successor is due instead of preparing one; the roots
// stay trusted.
func TestExportedRootKeyIsOffline(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, fastCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	if _, err := s.rotateRoot(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, _, err := s.stepRoot(ctx, "t", rootNext); err != nil {
			t.Fatal(err)
		}
	}
	rot, err := a.store.GetRootRotation(ctx)
	if err != nil || rot.Phase != "standby" || rot.NewKeyRef == nil {
		t.Fatalf("after three steps: %+v %v; want standby with the new root's key held", rot.Phase, err)
	}
	if s.ca.Roots().SigningKey == nil {
		t.Fatal("in standby with the key in the store the signing root key is not held")
	}
	next := rot
	next.NewKeyRef = nil
	if err := a.store.PutRootRotation(ctx, rot, next, false, setupLink); err != nil {
		t.Fatal(err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatalf("reading roots whose signing key was exported: %v", err)
	}
	rs := s.ca.Roots()
	if rs.SigningKey != nil || ca.Fingerprint(rs.Signing) != ca.Fingerprint(s.inter.mustNewRoot(t)) {
		t.Fatalf("after the export: signing root %s, key held %v; want the new root, no key", ca.Fingerprint(rs.Signing), rs.SigningKey != nil)
	}
	rowsBefore, _ := a.store.ListCACerts(ctx)
	later := time.Now().Add(200 * 24 * time.Hour) // past every active intermediate's half-life
	if err := s.caStepAt(ctx, later); err != nil {
		t.Fatal(err)
	}
	if rows, _ := a.store.ListCACerts(ctx); len(rows) != len(rowsBefore) {
		t.Fatalf("the CA clock prepared %d intermediates with the root key offline", len(rows)-len(rowsBefore))
	}
	warn := s.caWarnings(later)
	if len(warn) != len(caRoles) || !strings.Contains(warn[ca.RoleAgent], "--root-key FILE") {
		t.Fatalf("warnings with the exported root key: %v; want one per role naming --root-key FILE", warn)
	}
}

// mustNewRoot is the stored rotation's new root.
func (in *intermediates) mustNewRoot(t *testing.T) *x509.Certificate {
	t.Helper()
	st, err := in.readRoots(t.Context())
	if err != nil || st.new == nil {
		t.Fatalf("reading the new root: %v", err)
	}
	return st.new
}
