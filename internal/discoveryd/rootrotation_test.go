package discoveryd

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func rotationRoot(t *testing.T, name string) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := ca.NewSerial()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ca.NewRoot(name, serial, key, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return root, key
}

func pemOf(certs ...*x509.Certificate) string {
	var out []byte
	for _, c := range certs {
		out = append(out, ca.EncodeCertPEM(c)...)
	}
	return string(out)
}

// TestRegisterAcrossARootRotation: on the allow-list under the root its ID
// names, an authority registers a new root through the cross-certificate
// of its root rotation, and lookups list the new root; a registration
// whose new root its own root never certified is refused, audited and
// counted, and what is served does not change.
func TestRegisterAcrossARootRotation(t *testing.T) {
	a := newAuthority(t, "prod")
	e := start(t, generous, allowing(false, discovery.AllowEntry{AuthorityID: a.id, Fingerprint: a.h.Fingerprint()}))
	e.register(a, 1, openPolicy())

	now := time.Now()
	r1, k1 := rotationRoot(t, "prod")
	r1ByB, err := ca.CrossSign(r1, a.h.Root, a.h.RootKey, now)
	if err != nil {
		t.Fatal(err)
	}
	bByR1, err := ca.CrossSign(a.h.Root, r1, k1, now)
	if err != nil {
		t.Fatal(err)
	}
	reg := func(version int64, bundle string) *musterv1.RegisterAuthorityRequest {
		return a.sign(t, discovery.Registration{AuthorityID: a.id, Endpoints: []string{"authority.example:7443"}, CABundlePEM: bundle,
			Policy: policyJSON(t, openPolicy()), Version: version}, a.h.Issuer(ca.RolePolicy))
	}
	lookupRoots := func() []string {
		t.Helper()
		look, err := e.client.LookupAuthority(ctxT(t), &musterv1.LookupAuthorityRequest{AuthorityId: a.id})
		if err != nil {
			t.Fatal(err)
		}
		if look.GetCaFingerprint() != a.h.Fingerprint() {
			t.Errorf("lookup names %s; want the root the ID is locked to, %s", look.GetCaFingerprint(), a.h.Fingerprint())
		}
		roots, err := discovery.ParseRoots(look.GetCaBundlePem())
		if err != nil {
			t.Fatal(err)
		}
		return roots.Fingerprints()
	}
	steps := []struct {
		phase  string
		bundle string
		want   []string
	}{
		{"init", pemOf(a.h.Root, a.h.Root, r1, r1ByB, bByR1), []string{a.h.Fingerprint(), ca.Fingerprint(r1)}},
		{"update_servers", pemOf(a.h.Root, r1, a.h.Root, r1ByB, bByR1), []string{ca.Fingerprint(r1), a.h.Fingerprint()}},
		{"standby", pemOf(a.h.Root, r1, r1ByB), []string{ca.Fingerprint(r1)}},
	}
	version := int64(1)
	for _, s := range steps {
		version++
		if _, err := e.client.RegisterAuthority(ctxT(t), reg(version, s.bundle)); err != nil {
			t.Fatalf("%s: %v", s.phase, err)
		}
		if got := lookupRoots(); !slices.Equal(got, s.want) {
			t.Errorf("%s: lookup lists roots %v; want %v", s.phase, got, s.want)
		}
	}

	// Signed with the authority's policy key, but the root is one its
	// root never certified: refused before anything is written.
	stranger, _ := rotationRoot(t, "prod")
	_, err = e.client.RegisterAuthority(ctxT(t), reg(version+1, pemOf(a.h.Root, stranger)))
	wantCode(t, err, codes.PermissionDenied, "is not linked to "+a.h.Fingerprint())
	if got := lookupRoots(); !slices.Equal(got, []string{ca.Fingerprint(r1)}) {
		t.Errorf("after the refusal lookup lists %v; want the registered standby roots", got)
	}
	if got := counter(e.srv.metrics.registrations.WithLabelValues(resultRootNotLinked)); got != 1 {
		t.Errorf("registrations{root_not_linked} = %v, want 1", got)
	}
	e.stop()
	recs, err := e.st.ListAudit(context.Background(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, r := range recs {
		if r.Action == "authority.register" && r.Result != "ok" {
			refused++
			if !strings.Contains(r.Reason, ca.Fingerprint(stranger)) || !strings.Contains(r.Reason, "cross-certificate") {
				t.Errorf("refusal record %+v: want the root refused and the way in", r)
			}
		}
	}
	if refused != 1 {
		t.Errorf("%d refused registrations audited; want 1", refused)
	}
}
