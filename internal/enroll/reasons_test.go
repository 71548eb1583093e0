package enroll

import (
	"fmt"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// TestIssueReasons: the audit reasons a join, a renewal and a repeated
// renewal record name the method, proof, instance, generation and serial
// in the words the operator guide's audit examples use (they are built by
// concatenation on the request path, not formatted).
func TestIssueReasons(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token(t, 1)
	_, der := csr(t)
	joined, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der); err != nil {
		t.Fatal(err)
	}
	chain, _ := ca.ParseCertsPEM(joined.ChainPEM)
	_, der2 := csr(t)
	renewed, err := e.svc.Renew(t.Context(), Request{}, chain[0], der2)
	if err != nil {
		t.Fatal(err)
	}
	next, _ := ca.ParseCertsPEM(renewed.ChainPEM)
	if _, err := e.svc.Renew(t.Context(), Request{}, chain[0], der2); err != nil {
		t.Fatal(err)
	}
	first, second := serialOf(chain[0]), serialOf(next[0])
	want := []string{
		fmt.Sprintf("method %s, token %s, instance %s, serial %s", store.JoinMethodToken, tok.ID, joined.InstanceID, first),
		fmt.Sprintf("retry answered with instance %s, serial %s", joined.InstanceID, first), // seen at the read (retryJoin)
		fmt.Sprintf("instance %s, generation %d, serial %s", joined.InstanceID, 1, second),
		fmt.Sprintf("retry answered with generation %d, serial %s", 1, second),
	}
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	if len(e.audit.events) != len(want) {
		t.Fatalf("%d audit events, want %d: %+v", len(e.audit.events), len(want), e.audit.events)
	}
	for i, ev := range e.audit.events {
		if ev.Reason != want[i] {
			t.Errorf("event %d reason %q, want %q (%+v)", i, ev.Reason, want[i], ev)
		}
	}
}
