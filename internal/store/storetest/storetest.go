// Package storetest is the conformance suite for store.Store: every backend
// runs RunStoreTests from its own tests, so the contract documented in
// package store is checked once and the same way for all of them (after
// Tailscale's tstest/chonktest and SPIRE's datastore/sqltest).
package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/muster-dev/muster/internal/store"
)

// testCase is one check against a fresh, empty store.
type testCase struct {
	name string
	run  func(t *testing.T, ctx context.Context, s store.Store)
}

// RunStoreTests runs the conformance suite. newStore must return a fresh,
// empty, migrated store each time it is called and arrange for it to be
// closed with t.Cleanup; every case gets its own. The cases run in
// parallel (go test -parallel of them at a time), each on its own store,
// so newStore must be safe to call from several goroutines. The PostgreSQL
// cases mostly wait on the server: the suite took 184 s one case at a
// time, 144 s two at a time and 92 s four at a time (measured on two
// loaded cores).
func RunStoreTests(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	groups := []struct {
		name  string
		cases []testCase
	}{
		{"Meta", metaCases()},
		{"PSK", pskCases()},
		{"PSKRotate", pskRotateCases()},
		{"Operator", operatorCases()},
		{"Lock", lockCases()},
		{"Audit", auditCases()},
		{"AuditList", auditListCases()},
		{"Checkpoint", checkpointCases()},
		{"Token", tokenCases()},
		{"RaiseTokenUses", raiseUsesCases()},
		{"Join", joinCases()},
		{"TokenUse", tokenUseCases()},
		{"JoinRead", joinReadCases()},
		{"RenewalRead", renewalReadCases()},
		{"JoinRetry", retryCases()},
		{"Renewal", renewalCases()},
		{"WriteLock", writeLockCases()},
		{"Node", nodeCases()},
		{"Carry", carryCases()},
		{"JoinAudit", joinAuditCases()},
		{"TicketUse", ticketUseCases()},
		{"ReportOutbox", reportOutboxCases()},
		{"Registration", registrationCases()},
		{"JoinReport", joinReportCases()},
		{"TicketKey", ticketKeyCases()},
		{"Signer", signerCases()},
		{"CACert", caCertCases()},
		{"CARoot", caRootCases()},
		{"Task", taskCases()},
		{"AgentStream", agentStreamCases()},
		{"BoundKeypair", boundKeypairCases()},
		{"JoinStateKey", joinStateKeyCases()},
		{"Resync", resyncCases()},
		{"Rebind", rebindCases()},
		{"Seed", seedCases()},
		{"TokenCount", tokenCountCases()},
		{"Page", pageCases()},
		{"MissingNodes", missingNodesCases()},
		{"AgentList", agentListCases()},
		{"CRL", crlCases()},
		{"JWTKey", jwtKeyCases()},
		{"KeyCustody", keyCustodyCases()},
		{"Setting", settingCases()},
		{"AgentCert", agentCertCases()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, t.Context(), newStore(t))
				})
			}
		})
	}
}

// cmpOpts compares records as the contract promises them back: times equal
// instants in UTC (inputs are built in UTC at microsecond precision; the
// "Meta/times" case checks the conversion of other inputs), and a nil and an
// empty byte slice alike.
var cmpOpts = cmp.Options{
	cmpopts.EquateEmpty(),
	cmp.Comparer(func(a, b time.Time) bool {
		return a.Equal(b) && a.Location() == b.Location()
	}),
}

// base is an arbitrary UTC instant with a non-zero microsecond part.
var base = time.Date(2025, 6, 1, 12, 30, 45, 123456000, time.UTC)

// at returns base plus d.
func at(d time.Duration) time.Time { return base.Add(d) }

func mustNil(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// wantErr fails unless err wraps want (or is nil when want is nil).
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("%s: unexpected error %v", what, err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("%s: error %v, want one wrapping %v", what, err, want)
	}
}

func wantEqual[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", what, diff)
	}
}

func metaCases() []testCase {
	return []testCase{
		{"schema version is positive", func(t *testing.T, ctx context.Context, s store.Store) {
			v, err := s.SchemaVersion(ctx)
			mustNil(t, "SchemaVersion", err)
			if v <= 0 {
				t.Errorf("SchemaVersion = %d, want > 0", v)
			}
		}},
		{"now is close to the local clock", func(t *testing.T, ctx context.Context, s store.Store) {
			before := time.Now()
			now, err := s.Now(ctx)
			after := time.Now()
			mustNil(t, "Now", err)
			const slack = 2 * time.Second
			if now.Before(before.Add(-slack)) || now.After(after.Add(slack)) {
				t.Errorf("Now = %v, want within %v of [%v, %v]", now, slack, before, after)
			}
		}},
		{"now advances", func(t *testing.T, ctx context.Context, s store.Store) {
			t1, err := s.Now(ctx)
			mustNil(t, "Now", err)
			time.Sleep(5 * time.Millisecond)
			t2, err := s.Now(ctx)
			mustNil(t, "Now", err)
			if !t2.After(t1) {
				t.Errorf("Now went from %v to %v, want it to advance", t1, t2)
			}
		}},
		{"times come back in UTC to the microsecond", func(t *testing.T, ctx context.Context, s store.Store) {
			// An input in another zone with nanoseconds: the instant must
			// survive to the microsecond (truncated or rounded) and read
			// back in UTC with nothing below the microsecond.
			in := time.Date(2025, 6, 1, 14, 30, 45, 123456789, time.FixedZone("CEST", 2*3600))
			mustNil(t, "InsertOperator", s.InsertOperator(ctx, store.Operator{
				Serial: "0a", Name: "n", SPIFFEID: "spiffe://muster.test/operator/n",
				NotBefore: in, NotAfter: in, CreatedBy: "c", CreatedAt: in,
			}, link(record("operator.add"))))
			ops, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			if len(ops) != 1 {
				t.Fatalf("ListOperators returned %d operators, want 1", len(ops))
			}
			for name, got := range map[string]time.Time{
				"NotBefore": ops[0].NotBefore, "NotAfter": ops[0].NotAfter, "CreatedAt": ops[0].CreatedAt,
			} {
				if got.Location() != time.UTC {
					t.Errorf("%s location = %v, want UTC", name, got.Location())
				}
				if d := got.Sub(in).Abs(); d >= time.Microsecond {
					t.Errorf("%s = %v, want within 1µs of %v", name, got, in)
				}
				if got.Nanosecond()%1000 != 0 {
					t.Errorf("%s = %v has digits below the microsecond", name, got)
				}
			}
		}},
	}
}
