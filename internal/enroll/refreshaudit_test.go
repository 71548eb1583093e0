package enroll

import (
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
	lastRefused := func(b *bkEnv) string {
		b.audit.mu.Lock()
		defer b.audit.mu.Unlock()
		if len(b.audit.refused) == 0 {
			t.Fatal("no refusal audited")
		}
		return b.audit.refused[len(b.audit.refused)-1].Action
	}
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
