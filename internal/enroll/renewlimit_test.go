package enroll

import (
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/ratelimit"
	"github.com/muster-dev/muster/internal/store"
)

// TestRenewalsPerLifetime: an instance is given RenewalsPerLifetime
// renewals at once (the certificates here live an hour, so the
// allowance does not refill during the test); the next renewal is
// refused RESOURCE_EXHAUSTED's kind with the reason naming the setting,
// signs nothing and is audited. A retry of the last renewal (a lost
// reply) is still answered, and a re-join (a new instance of the node)
// has its own allowance. Without a limiter, or with 0, nothing is
// counted. Before, one agent certificate could renew without pause.
func TestRenewalsPerLifetime(t *testing.T) {
	tests := []struct {
		name        string
		perLifetime int
		limiter     bool
		renewals    int
		wantRenewed int
	}{
		{"within the allowance", 3, true, 3, 3},
		{"one past the allowance", 3, true, 4, 3},
		{"far past the allowance", 3, true, 8, 3},
		{"no limiter", 3, false, 8, 8},
		{"an allowance of 0 is none", 0, true, 8, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil)
			if tt.limiter {
				e.svc.cfg.Renewals = ratelimit.New(1, 1)
			}
			e.svc.cfg.RenewalsPerLifetime = tt.perLifetime
			tok := e.token(t, 0)
			_, der := csr(t)
			joined, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
			if err != nil {
				t.Fatal(err)
			}
			chain, _ := ca.ParseCertsPEM(joined.ChainPEM)
			leaf, prev, lastCSR := chain[0], chain[0], der
			renewed := 0
			for i := range tt.renewals {
				_, der := csr(t)
				iss, err := e.svc.Renew(t.Context(), Request{}, leaf, der)
				if i >= tt.wantRenewed {
					wantRefusal(t, err, KindRateLimited, ReasonRenewalsTooOften)
					continue
				}
				if err != nil {
					t.Fatalf("renewal %d: %v", i+1, err)
				}
				renewed++
				c, _ := ca.ParseCertsPEM(iss.ChainPEM)
				prev, leaf, lastCSR = leaf, c[0], der
			}
			inst, err := e.st.GetInstance(t.Context(), joined.InstanceID)
			if err != nil {
				t.Fatal(err)
			}
			if inst.Generation != int64(renewed) {
				t.Errorf("generation %d after %d renewals: a refused renewal signed", inst.Generation, renewed)
			}
			if tt.renewals <= tt.wantRenewed {
				return
			}
			var audited bool
			e.audit.mu.Lock()
			refused := append([]audit.Event(nil), e.audit.refused...)
			e.audit.mu.Unlock()
			for _, ev := range refused {
				audited = audited || ev.Action == "agent.renew" && ev.Result == audit.ResultDenied &&
					strings.HasPrefix(ev.Reason, ReasonRenewalsTooOften) && strings.Contains(ev.Reason, "more than 3 renewals in a certificate lifetime of 1h0m0s")
			}
			if !audited {
				t.Error("the refusal was not audited with its reason and detail")
			}
			// The last renewal's reply lost: its retry is answered,
			// though the allowance is spent.
			if _, err := e.svc.Renew(t.Context(), Request{}, prev, lastCSR); err != nil {
				t.Errorf("a retry of the last renewal after the allowance was spent: %v", err)
			}
			// A re-join (a token bound to the node) makes a new instance,
			// with an allowance of its own.
			bound, _ := jointoken.Generate()
			ct, nonce, _ := e.seal.Seal(bound.Secret(), []byte(bound.ID))
			if err := e.st.InsertToken(t.Context(), store.Token{ID: bound.ID, JoinMethod: store.JoinMethodToken, Ciphertext: ct, Nonce: nonce,
				UsesAllowed: 1, NodeID: "n1", CreatedAt: time.Now()}, setupLink); err != nil {
				t.Fatal(err)
			}
			_, der = csr(t)
			again, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, bound.Reveal(), "n1", der)
			if err != nil {
				t.Fatalf("re-join: %v", err)
			}
			c, _ := ca.ParseCertsPEM(again.ChainPEM)
			_, der = csr(t)
			if _, err := e.svc.Renew(t.Context(), Request{}, c[0], der); err != nil {
				t.Errorf("the re-joined instance's first renewal: %v", err)
			}
		})
	}
}
