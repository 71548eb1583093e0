package enroll

import (
	"crypto/x509"
	"testing"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// A bound-keypair token's svid_usage is its agent's policy for as long as
// the token stands: the registration, each refresh and each recovery
// issue serverAuth exactly when the token says client,server as read
// then, so changing it (token apply) takes effect at the next refresh or
// recovery, both ways.
func TestBoundKeypairSVIDUsage(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	setUsage := func(usage string) {
		t.Helper()
		if _, err := b.st.UpdateBoundKeypairSpec(t.Context(), "bot-1", b.status(t).Spec, usage); err != nil {
			t.Fatal(err)
		}
	}
	leafOf := func(iss *Issued) []*x509.Certificate {
		t.Helper()
		certs, err := ca.ParseCertsPEM(iss.ChainPEM)
		if err != nil {
			t.Fatal(err)
		}
		return certs
	}
	refresh := func(res *BoundKeypairResult) *BoundKeypairResult {
		t.Helper()
		_, der := csr(t)
		next, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
			CSR: der, JoinState: res.JoinState, Cert: leafOf(res.Issued)[0]}, answerWith(b.priv))
		if err != nil {
			t.Fatalf("refresh: %v", err)
		}
		return next
	}
	want := func(step string, res *BoundKeypairResult, server bool) {
		t.Helper()
		if got := servesTLS(leafOf(res.Issued)[0]); got != server {
			t.Errorf("%s: serverAuth %v, want %v", step, got, server)
		}
	}

	setUsage(store.SVIDUsageClientServer)
	reg, _ := b.register(t)
	want("registration with client,server", reg, true)
	ref := refresh(reg)
	want("refresh with client,server", ref, true)
	setUsage("")
	ref = refresh(ref)
	want("refresh after the usage went back to client", ref, false)
	setUsage(store.SVIDUsageClientServer)
	ref = refresh(ref)
	want("refresh after client,server again", ref, true)
	setUsage("")
	rec, err := b.recover(t, ref.JoinState)
	if err != nil {
		t.Fatal(err)
	}
	want("recovery with client", rec, false)
	setUsage(store.SVIDUsageClientServer)
	rec, err = b.recover(t, rec.JoinState)
	if err != nil {
		t.Fatal(err)
	}
	want("recovery with client,server", rec, true)
}
