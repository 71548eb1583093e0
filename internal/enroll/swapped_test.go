package enroll

import (
	"fmt"
	"strings"
	"testing"
)

// TestSwappedTokenAndNodeNotRecorded: a join whose token and node ID were
// swapped (the node ID a whole join token) is refused INVALID_ARGUMENT
// saying so, and the token's secret is in no audit record: the refused
// join's target was the node ID as given.
func TestSwappedTokenAndNodeNotRecorded(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token(t, 1)
	_, der := csr(t)
	_, err := e.svc.ExchangeJoinToken(t.Context(), Request{Source: "192.0.2.1"}, "web-01", tok.Reveal(), der)
	wantRefusal(t, err, KindInvalid, reasonSwapped)
	secret := strings.TrimPrefix(tok.Reveal(), tok.ID+".")
	if len(e.audit.refused) == 0 {
		t.Fatal("the refusal was not audited")
	}
	for _, ev := range append(e.audit.refused, e.audit.events...) {
		if strings.Contains(fmt.Sprintf("%+v", ev), secret) {
			t.Errorf("audit record holds the token's secret: %+v", ev)
		}
	}
	if got := e.audit.refused[0].Target; got != tok.ID+".REDACTED" {
		t.Errorf("target %q, want %s.REDACTED", got, tok.ID)
	}
}
