package enroll

import (
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/store"
)

// lastRefusal is the reason of the newest refusal audited whose action
// is action.
func (e *env) lastRefusal(t *testing.T, action string) string {
	t.Helper()
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	for i := len(e.audit.refused) - 1; i >= 0; i-- {
		if e.audit.refused[i].Action == action {
			return e.audit.refused[i].Reason
		}
	}
	t.Fatalf("no %s refusal in %+v", action, e.audit.refused)
	return ""
}

// TestLockRefusalsAuditTheWayOut: the audit record of a renewal refused
// for a lock, and of the one that found a copy and locked the instance,
// names what the operator runs, not only the lock's ID.
func TestLockRefusalsAuditTheWayOut(t *testing.T) {
	e := newEnv(t, nil)
	_, der := csr(t)
	locked, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, e.token(t, 1).Reveal(), "n1", der)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.st.InsertLock(t.Context(), store.Lock{ID: "l1", Kind: store.LockInstance, Target: locked.InstanceID, CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	chain, _ := ca.ParseCertsPEM(locked.ChainPEM)
	_, der = csr(t)
	_, err = e.svc.Renew(t.Context(), Request{}, chain[0], der)
	wantRefusal(t, err, KindPermissionDenied, ReasonLocked)
	if r := e.lastRefusal(t, "agent.renew"); !strings.Contains(r, "muster lock delete l1") {
		t.Errorf("locked renewal audited %q: no way out", r)
	}

	_, der = csr(t)
	joined, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, e.token(t, 1).Reveal(), "n2", der)
	if err != nil {
		t.Fatal(err)
	}
	chain, _ = ca.ParseCertsPEM(joined.ChainPEM)
	_, der = csr(t)
	if _, err := e.svc.Renew(t.Context(), Request{}, chain[0], der); err != nil {
		t.Fatal(err)
	}
	_, der = csr(t)
	_, err = e.svc.Renew(t.Context(), Request{}, chain[0], der)
	wantRefusal(t, err, KindPermissionDenied, ReasonCopyDetected)
	r := e.lastRefusal(t, "agent.renew")
	for _, want := range []string{"muster token create --node n2", "muster lock delete lock-"} {
		if !strings.Contains(r, want) {
			t.Errorf("copy_detected audited %q: want it to name %q", r, want)
		}
	}
}

// TestStandingRefusalsAuditTheWayOut: the audit record of a renewal
// refused because its instance was superseded, or its node deleted, names
// what the operator runs to bring the machine back.
func TestStandingRefusalsAuditTheWayOut(t *testing.T) {
	e := newEnv(t, nil)
	_, der := csr(t)
	first, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, e.token(t, 1).Reveal(), "n1", der)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := ca.ParseCertsPEM(first.ChainPEM)
	// Re-provisioned with a token bound to the node: the first instance
	// is superseded.
	bound, _ := jointoken.Generate()
	ct, nonce, _ := e.seal.Seal(bound.Secret(), []byte(bound.ID))
	if err := e.st.InsertToken(t.Context(), store.Token{ID: bound.ID, JoinMethod: store.JoinMethodToken, Ciphertext: ct, Nonce: nonce,
		UsesAllowed: 1, NodeID: "n1", CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	_, der = csr(t)
	second, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, bound.Reveal(), "n1", der)
	if err != nil {
		t.Fatal(err)
	}
	_, der = csr(t)
	_, err = e.svc.Renew(t.Context(), Request{}, old[0], der)
	wantRefusal(t, err, KindPermissionDenied, ReasonSuperseded)
	if r := e.lastRefusal(t, "agent.renew"); !strings.Contains(r, "muster token create --node n1") {
		t.Errorf("superseded renewal audited %q: no way out", r)
	}

	if err := e.st.DeleteNode(t.Context(), "n1", setupLink); err != nil {
		t.Fatal(err)
	}
	current, _ := ca.ParseCertsPEM(second.ChainPEM)
	_, der = csr(t)
	_, err = e.svc.Renew(t.Context(), Request{}, current[0], der)
	wantRefusal(t, err, KindPermissionDenied, ReasonDeleted)
	if r := e.lastRefusal(t, "agent.renew"); !strings.Contains(r, "muster token create --node n1") {
		t.Errorf("renewal of a deleted node audited %q: no way out", r)
	}
}
