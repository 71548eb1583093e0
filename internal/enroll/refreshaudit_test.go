package enroll

import (
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// TestRefusedRefreshAuditedAsRefresh: a refresh refused — whatever the
// step that refuses it: the challenge, a lock, the join state, a copy —
// is audited under agent.refresh, the refresh's own action, and a refused
// recovery under agent.join.
func TestRefusedRefreshAuditedAsRefresh(t *testing.T) {
	refreshWith := func(b *bkEnv, answer Challenge, joinState string, lock bool) {
		t.Helper()
		first, _ := b.register(t)
		if lock {
			if err := b.st.InsertLock(t.Context(), store.Lock{ID: "l1", Kind: store.LockNode, Target: "node-1", CreatedAt: time.Now()}, setupLink); err != nil {
				t.Fatal(err)
			}
		}
		leaf, err := ca.ParseCertsPEM(first.ChainPEM)
		if err != nil {
			t.Fatal(err)
		}
		if joinState == "" {
			joinState = first.JoinState
		}
		_, der := csr(t)
		if _, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
			CSR: der, JoinState: joinState, Cert: leaf[0]}, answer); err == nil {
			t.Fatal("the refresh was not refused")
		}
	}
	lastRefused := func(b *bkEnv) string { return b.audit.lastRefused(t).Action }
	t.Run("challenge_failed", func(t *testing.T) {
		b := newBKEnv(t, 2, boundkeypair.ModeStandard)
		other, _ := newKey(t)
		refreshWith(b, answerWith(other), "", false)
		if got := lastRefused(b); got != "agent.refresh" {
			t.Errorf("action %q, want agent.refresh", got)
		}
	})
	t.Run("locked", func(t *testing.T) {
		b := newBKEnv(t, 2, boundkeypair.ModeStandard)
		refreshWith(b, answerWith(b.priv), "", true)
		if got := lastRefused(b); got != "agent.refresh" {
			t.Errorf("action %q, want agent.refresh", got)
		}
	})
	t.Run("join_state_mismatch", func(t *testing.T) {
		b := newBKEnv(t, 2, boundkeypair.ModeStandard)
		refreshWith(b, answerWith(b.priv), "not.a.jwt", false)
		if got := lastRefused(b); got != "agent.refresh" {
			t.Errorf("action %q, want agent.refresh", got)
		}
	})
	t.Run("recovery", func(t *testing.T) {
		b := newBKEnv(t, 2, boundkeypair.ModeStandard)
		b.register(t)
		if _, err := b.recover(t, "not.a.jwt"); err == nil {
			t.Fatal("a recovery with a bad join state was not refused")
		}
		if got := lastRefused(b); got != "agent.join" {
			t.Errorf("action %q, want agent.join", got)
		}
	})
}

// TestRefusedResyncOfRefreshAuditedAsJoin: a caller holding its current
// certificate whose join state is ahead of the store, inside a resync
// window, is judged a recovery (a resync); refused after the rules (here
// its new key's challenge fails), it is audited under agent.join, as its
// success would be, not agent.refresh.
func TestRefusedResyncOfRefreshAuditedAsJoin(t *testing.T) {
	b := newBKEnv(t, 2, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	leaf, err := ca.ParseCertsPEM(first.ChainPEM)
	if err != nil {
		t.Fatal(err)
	}
	ahead := b.signedAt(t, first.JoinState, 4, "")
	if _, err := b.st.OpenResync(t.Context(), store.ResyncOpen{ID: "ep-1", For: time.Hour, OpenedBy: "admin:test", Reason: "restore"}, setupEpochLink); err != nil {
		t.Fatal(err)
	}
	other, _ := newBoundKey(t)
	_, newPub := newBoundKey(t)
	wrongNewKey, _ := answerInTurn(b.priv, other)
	_, der := csr(t)
	if _, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, JoinState: ahead, Cert: leaf[0], NewPublicKey: newPub.String()}, wrongNewKey); err == nil {
		t.Fatal("a rotation whose new key failed its challenge was not refused")
	}
	last := b.audit.lastRefused(t)
	if !strings.Contains(last.Reason, "new key") {
		t.Fatalf("refused for %q, want the new key's challenge", last.Reason)
	}
	if got := last.Action; got != "agent.join" {
		t.Errorf("action %q, want agent.join (the join was a resync, a recovery)", got)
	}
}
