//go:build pkcs11 && cgo

package authority

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
	"github.com/muster-dev/muster/internal/store"
)

// tokenReplica is one replica whose CA keys are made in a SoftHSM2
// token, and the token's CA custody, to delete objects behind its back.
func tokenReplica(t *testing.T) (*benchAuthority, *custody.Token) {
	t.Helper()
	tok := softhsmtest.Start(t)
	tk, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: tok.PINFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tk.Close() })
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) {
		c.CAIntermediateTTL = 3 * time.Minute
		c.WrapCACustody = func(sealed custody.Custody) (custody.Custody, error) {
			inToken, err := CACustody(c.StorageKey, tk)
			return importSealed{Custody: inToken, sealed: sealed.(custody.Importer)}, err
		}
	})
	return a, tk
}

// deleteKey removes r's key objects from the token, as a token restored
// without them (or an operator's pkcs11-tool) would.
func deleteKey(t *testing.T, ctx context.Context, tokenCA *custody.PKCS11, r store.CACert) {
	t.Helper()
	if err := tokenCA.Destroy(ctx, keyName(r.Role, r.Serial), custody.Key{Ref: r.KeyRef}); err != nil {
		t.Fatal(err)
	}
}

// TestLostRetiringKeyDoesNotStopStart: a retiring intermediate whose key
// is gone from the token (it signs no new leaf) no longer stops a replica
// reading the intermediates, as at its start: it stays in the trust
// bundle, keyless, so its leaves still verify until it retires. An active
// intermediate whose key is gone does stop it, and the refusal names
// the way out (a new intermediate made offline under the root).
func TestLostRetiringKeyDoesNotStopStart(t *testing.T) {
	a, tk := tokenReplica(t)
	tokenCA := tk.For("muster-ca/")
	s := a.srvs[0]
	ctx := t.Context()
	now := time.Now()
	old := storeIntermediate(t, ctx, a, now.Add(-time.Minute), 3*time.Minute)
	cur := storeIntermediate(t, ctx, a, now.Add(-10*time.Second), 3*time.Minute)
	if !custody.IsPKCS11Ref(old.KeyRef) {
		t.Fatalf("the test's intermediate key is not in the token: %q", old.KeyRef)
	}
	deleteKey(t, ctx, tokenCA, old)
	// What this read installs, from its own state: the replica's running
	// reader may install its own set meanwhile, with the key it opened
	// before the object went.
	in, err := newIntermediates(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.load(ctx); err != nil {
		t.Fatalf("a retiring intermediate's lost key stops the start: %v", err)
	}
	if !strings.Contains(in.loaded, "agent/"+old.Serial+"/"+store.CARetiring) {
		t.Errorf("the retiring intermediate whose key is gone left the set read: %s", in.loaded)
	}
	if in.signers[old.Serial] != nil {
		t.Error("the retiring intermediate whose key is gone has a key")
	}
	if in.signers[cur.Serial] == nil {
		t.Error("the active intermediate has no key")
	}
	deleteKey(t, ctx, tokenCA, cur)
	err = readAsAtStart(t, s)
	if !errors.Is(err, custody.ErrKeyMissing) {
		t.Fatalf("an active intermediate's lost key: %v, want ErrKeyMissing", err)
	}
	for _, want := range []string{"agent intermediate " + cur.Serial, "muster-pkcs11 ca rotate agent --offline --data "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}

	// The way out it names: a new agent intermediate under the root,
	// its key in the token, active at once; the lost one retiring.
	m := LostKeyRotation{Store: a.store, CA: a.h, StorageKey: a.sk, Token: tk, Audit: s.audit, Actor: "test",
		Role: ca.RoleAgent, IntermediateTTL: 3 * time.Minute}
	res, err := RotateLostIntermediate(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if !custody.IsPKCS11Ref(res.Active.KeyRef) || res.Previous.Serial != cur.Serial {
		t.Errorf("replaced %s by %s (%s), want %s replaced by a key in the token", res.Previous.Serial, res.Active.Serial, custody.Where(res.Active.KeyRef), cur.Serial)
	}
	after, err := newIntermediates(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := after.load(ctx); err != nil {
		t.Fatalf("after muster ca rotate agent --offline the replica still cannot start: %v", err)
	}
	if !strings.Contains(after.loaded, "agent/"+res.Active.Serial+"/"+store.CAActive) || after.signers[res.Active.Serial] == nil {
		t.Fatalf("the set read after the offline rotation: %s; want %s active with its key", after.loaded, res.Active.Serial)
	}
	// Its key signs, and the certificate chains to the root.
	if err := certOf(t, res.Active).CheckSignatureFrom(a.h.Root); err != nil {
		t.Error(err)
	}
	// A second run finds the active key opening, and refuses.
	if _, err := RotateLostIntermediate(ctx, m); err == nil || !strings.Contains(err.Error(), "opens: it is not lost") {
		t.Errorf("a second run: %v, want a refusal saying the key opens", err)
	}
}

// certOf parses r's certificate.
func certOf(t *testing.T, r store.CACert) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(r.CertDER)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReadyzSeesMissingActiveKey: /readyz stops saying ready once the
// active intermediate's key object is gone from a token that still
// answers (it checked only that the token answers), with the reason and
// the way out; muster_ca_key_available says which key.
func TestReadyzSeesMissingActiveKey(t *testing.T) {
	a, tk := tokenReplica(t)
	s := a.srvs[0]
	ctx := t.Context()
	cur := storeIntermediate(t, ctx, a, time.Now().Add(-10*time.Second), 3*time.Minute)
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	readyz := func() (int, string) {
		rec := httptest.NewRecorder()
		s.metricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	metric := func() string {
		rec := httptest.NewRecorder()
		s.metricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		for _, l := range strings.Split(rec.Body.String(), "\n") {
			if strings.HasPrefix(l, "muster_ca_key_available{") && strings.Contains(l, cur.Serial) {
				return l
			}
		}
		return ""
	}
	s.inter.probeKeys(ctx)
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz with every key in the token: %d %s", code, body)
	}
	if m := metric(); !strings.HasSuffix(m, " 1") {
		t.Errorf("muster_ca_key_available with the key in the token: %q", m)
	}
	deleteKey(t, ctx, tk.For("muster-ca/"), cur)
	s.inter.probeKeys(ctx)
	code, body := readyz()
	if code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the active key gone from the token: %d %s, want 503", code, body)
	}
	for _, want := range []string{"agent intermediate " + cur.Serial, "not in the PKCS#11 token", "muster-pkcs11 ca rotate agent --offline"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz says %q, not %q", body, want)
		}
	}
	if m := metric(); !strings.HasSuffix(m, " 0") {
		t.Errorf("muster_ca_key_available with the key gone: %q", m)
	}
}

// DestroyFound passes the token's answer through, as the authority's own
// custody does.
func (c importSealed) DestroyFound(ctx context.Context, name string, k custody.Key) (bool, error) {
	return custody.DestroyFound(ctx, c.Custody, name, k)
}

// TestStatusAndRetireSayKeyMissing: muster ca status shows an
// intermediate whose token object is gone as missing, with a warning (not
// its pkcs11: URI as if the key were there), and retiring it records that
// its key was already gone, not that it was destroyed.
func TestStatusAndRetireSayKeyMissing(t *testing.T) {
	a, tk := tokenReplica(t)
	s := a.srvs[0]
	ctx := t.Context()
	now := time.Now()
	expired := storeIntermediate(t, ctx, a, now.Add(-10*time.Minute), 5*time.Minute)
	current := storeIntermediate(t, ctx, a, now.Add(-10*time.Second), 3*time.Minute)
	deleteKey(t, ctx, tk.For("muster-ca/"), expired)
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := s.caStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range resp.GetCertificates() {
		got[c.GetSerial()] = c.GetKeyCustody()
	}
	if w := got[expired.Serial]; !strings.HasPrefix(w, "missing: pkcs11:") {
		t.Errorf("ca status shows the key gone from the token as %q, want missing: pkcs11:…", w)
	}
	if w := got[current.Serial]; !strings.HasPrefix(w, "pkcs11:") {
		t.Errorf("ca status shows the key in the token as %q", w)
	}
	if !strings.Contains(strings.Join(resp.GetWarnings(), "\n"), "retiring agent intermediate "+expired.Serial+"'s key is missing") {
		t.Errorf("ca status warnings %q say nothing of the missing key", resp.GetWarnings())
	}

	if err := s.caStepAt(ctx, now); err != nil {
		t.Fatal(err)
	}
	recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.destroy_key"})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || !strings.Contains(recs[0].Reason, "was already gone from the token") || strings.Contains(recs[0].Reason, "destroyed") {
		t.Fatalf("ca.destroy_key records %+v; want one saying its key was already gone", recs)
	}
}

// TestLostPreparedKey: a prepared successor whose key is gone stops the
// start too (it is to sign once activated), naming the same way out,
// which replaces it with a new prepared one and leaves the active one.
func TestLostPreparedKey(t *testing.T) {
	a, tk := tokenReplica(t)
	s := a.srvs[0]
	ctx := t.Context()
	cur := storeIntermediate(t, ctx, a, time.Now().Add(-10*time.Second), 3*time.Minute)
	prepared, err := s.inter.prepareUnder(ctx, ca.RoleAgent, a.h.Root, a.h.RootKey, 3*time.Minute, s.testPrepareLink)
	if err != nil {
		t.Fatal(err)
	}
	deleteKey(t, ctx, tk.For("muster-ca/"), prepared)
	if err := readAsAtStart(t, s); err == nil || !strings.Contains(err.Error(), "muster-pkcs11 ca rotate agent --offline --data ") {
		t.Fatalf("a prepared intermediate's lost key: %v, want a refusal naming muster ca rotate agent --offline", err)
	}
	res, err := RotateLostIntermediate(ctx, LostKeyRotation{Store: a.store, CA: a.h, StorageKey: a.sk, Token: tk, Audit: s.audit,
		Actor: "test", Role: ca.RoleAgent, IntermediateTTL: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !res.PreparedOnly || res.Active.Serial == prepared.Serial || res.Previous.Serial != cur.Serial {
		t.Fatalf("result %+v: want a new prepared one beside the active %s", res, cur.Serial)
	}
	after, err := newIntermediates(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := after.load(ctx); err != nil {
		t.Fatalf("after the offline rotation: %v", err)
	}
	if !strings.Contains(after.loaded, "agent/"+cur.Serial+"/"+store.CAActive) || !strings.Contains(after.loaded, "agent/"+res.Active.Serial+"/"+store.CAPrepared) {
		t.Errorf("the set read after the offline rotation: %s; want %s active, %s prepared", after.loaded, cur.Serial, res.Active.Serial)
	}
}

// TestLostRootKeyNamesTheWayOut: a root rotation's root made in the token
// whose key object is then gone (the token initialised again, restored
// from a backup older than the rotation) stops a starting replica, with
// the root, the object and the way out named: restore the token, or a new
// authority, since nothing else can sign intermediates under that root.
func TestLostRootKeyNamesTheWayOut(t *testing.T) {
	a, tk := tokenReplica(t)
	tokenCA := tk.For("muster-ca/")
	s := a.srvs[0]
	ctx := t.Context()
	st, err := s.rotateRoot(ctx, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	rot, err := a.store.GetRootRotation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !custody.IsPKCS11Ref(rot.NewKeyRef) {
		t.Fatalf("the new root's key is not in the token: %q", rot.NewKeyRef)
	}
	if err := tokenCA.Destroy(ctx, rootKeyName(st.New), custody.Key{Ref: rot.NewKeyRef}); err != nil {
		t.Fatal(err)
	}
	err = readAsAtStart(t, s)
	if !errors.Is(err, custody.ErrKeyMissing) {
		t.Fatalf("the new root's lost key: %v, want ErrKeyMissing", err)
	}
	for _, want := range []string{"the stored new root: " + ca.Fingerprint(st.New), string(rot.NewKeyRef),
		"restore the token from its backup", "muster init --data NEWDIR", `docs/hsm.md "A lost token"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
}
