package enroll

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
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

// TestTokenRefusalReasonsNameTheWayOut: the audit record of a join token
// refused as expired, used up, bound to another node, or for a node that
// exists names what the operator runs, for the node that asked.
func TestTokenRefusalReasonsNameTheWayOut(t *testing.T) {
	e := newEnv(t, nil)
	used := e.token(t, 1)
	_, der := csr(t)
	if _, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, used.Reveal(), "n1", der); err != nil {
		t.Fatal(err)
	}
	expired, _ := jointoken.Generate()
	ct, nonce, _ := e.seal.Seal(expired.Secret(), []byte(expired.ID))
	if err := e.st.InsertToken(t.Context(), store.Token{ID: expired.ID, JoinMethod: store.JoinMethodToken, Ciphertext: ct, Nonce: nonce,
		UsesAllowed: 1, CreatedAt: time.Now().Add(-time.Hour), ExpiresAt: time.Now().Add(-time.Minute)}, setupLink); err != nil {
		t.Fatal(err)
	}
	bound, _ := jointoken.Generate()
	ct, nonce, _ = e.seal.Seal(bound.Secret(), []byte(bound.ID))
	if err := e.st.InsertToken(t.Context(), store.Token{ID: bound.ID, JoinMethod: store.JoinMethodToken, Ciphertext: ct, Nonce: nonce,
		UsesAllowed: 1, NodeID: "web-01", CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	fresh := e.token(t, 1)
	for _, c := range []struct {
		tok  jointoken.Token
		node string
		want string
	}{
		{used, "n2", "a new token: muster token create --node n2"},
		{expired, "n3", "a new token: muster token create --node n3"},
		{bound, "n4", "join as web-01, or with a token for n4: muster token create --node n4"},
		{fresh, "n1", "re-provisioning node n1: muster token create --node n1, then on the machine muster agent join --force --data ADIR with the joining URI it prints; a machine that is gone: muster agents delete n1"},
	} {
		_, der := csr(t)
		if _, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, c.tok.Reveal(), c.node, der); err == nil {
			t.Fatalf("%s for %s: admitted", c.tok.ID, c.node)
		}
		e.audit.mu.Lock()
		last := e.audit.refused[len(e.audit.refused)-1]
		e.audit.mu.Unlock()
		if !strings.Contains(last.Reason, c.want) {
			t.Errorf("%s for %s: audit reason %q, want it to name %q", c.tok.ID, c.node, last.Reason, c.want)
		}
	}
}

// TestBotAddNamesTheNode: the bound-keypair way outs make the new token
// with muster bot add NODE, which names the token after its node: plain
// for a token muster bot add made (named after its node), and saying
// which name the agent then joins with for one named otherwise.
func TestBotAddNamesTheNode(t *testing.T) {
	if got, want := botAdd("web-01", "web-01", ""), "muster bot add web-01"; got != want {
		t.Errorf("a token named after its node: %q, want %q", got, want)
	}
	got := botAdd("ci-bot", "web-01", "")
	if !strings.HasPrefix(got, "muster bot add web-01 ") || !strings.Contains(got, "--bound-keypair web-01") {
		t.Errorf("a token named otherwise: %q, want muster bot add web-01 and the name the agent joins with", got)
	}
}

// TestBotAddCarriesTheTokensSettings: a way out that deletes a
// bound-keypair token and adds it again gives bot add the old token's
// settings where they are not bot add's defaults; with the defaults the
// new token would have one recovery, which the first join takes.
func TestBotAddCarriesTheTokensSettings(t *testing.T) {
	bk := func(limit int64, mode string) *store.BoundKeypair {
		return &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: limit, RecoveryMode: mode}}
	}
	for _, tc := range []struct {
		name string
		tok  store.Token
		want string
	}{
		{"defaults", store.Token{BoundKeypair: bk(1, boundkeypair.ModeStandard)}, ""},
		{"defaults, svid_usage client", store.Token{BoundKeypair: bk(1, ""), SVIDUsage: store.SVIDUsageClient}, ""},
		{"limit", store.Token{BoundKeypair: bk(5, boundkeypair.ModeStandard)}, " --recovery-limit 5"},
		{"everything", store.Token{BoundKeypair: bk(0, boundkeypair.ModeRelaxed), SVIDUsage: store.SVIDUsageClientServer},
			" --recovery-limit 0 --recovery-mode relaxed --svid-usage client,server"},
	} {
		if got := botAddFlags(tc.tok); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestWayOutAddsTheTokenAgainWithItsSettings: the audited way out of a
// refusal names bot add with the token's settings.
func TestWayOutAddsTheTokenAgainWithItsSettings(t *testing.T) {
	b := newBKEnv(t, 3, boundkeypair.ModeRelaxed)
	_, der := csr(t)
	b.svc.cfg.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1", CSR: der,
		PublicKey: b.pub.String(), RegistrationSecret: b.secret}, answerWith(b.priv))
	wantRefusal(t, err, KindFailedPrecondition, ReasonRegistrationClosed)
	b.wantAuditedWayOut(t, "muster token delete bot-1, muster bot add node-1 --recovery-limit 3 --recovery-mode relaxed (the new token is named after its node")
}
