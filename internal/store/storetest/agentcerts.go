package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// lifetime makes j's certificate issued at and valid from notBefore, to
// notAfter.
func lifetime(j store.Join, notBefore, notAfter time.Time) store.Join {
	j.Certificate.NotBefore, j.Certificate.NotAfter, j.Certificate.IssuedAt = notBefore, notAfter, notBefore
	return j
}

func countCerts(t *testing.T, ctx context.Context, s store.Store) store.AgentCertificateCounts {
	t.Helper()
	n, err := s.CountAgentCertificates(ctx)
	mustNil(t, "CountAgentCertificates", err)
	return n
}

func agentCertCases() []testCase {
	return []testCase{
		{"nodes are counted by their latest certificate, not deleted or superseded ones", func(t *testing.T, ctx context.Context, s store.Store) {
			wantEqual(t, "counts of an empty store", countCerts(t, ctx, s), store.AgentCertificateCounts{})
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t", 0, time.Time{}, time.Hour))
			join := func(node, inst string, from, to time.Duration, supersede bool) store.Join {
				j := lifetime(newJoin("t", node, inst, "key-"+inst, now), now.Add(from), now.Add(to))
				j.MaySupersede = supersede
				mustJoin(t, ctx, s, j)
				return j
			}
			// A quarter of its lifetime left or less: expiring.
			join("valid", "i-valid", -time.Minute, time.Hour, false)
			join("expiring", "i-expiring", -50*time.Minute, 10*time.Minute, false)
			join("expired", "i-expired", -2*time.Hour, -time.Hour, false)
			join("deleted", "i-deleted", -2*time.Hour, -time.Hour, false)
			mustNil(t, "DeleteNode", s.DeleteNode(ctx, "deleted", link(record("agent.delete"))))
			join("rejoined", "i-old", -2*time.Hour, -time.Hour, false)
			join("rejoined", "i-new", -time.Minute, 24*time.Hour, true)
			wantEqual(t, "counts", countCerts(t, ctx, s), store.AgentCertificateCounts{Valid: 2, Expiring: 1, Expired: 1})

			// A renewal's certificate is the node's latest.
			in, err := s.GetInstance(ctx, "i-expiring")
			mustNil(t, "GetInstance", err)
			r := renewalOf(in, "key-renewed", now)
			_, err = s.CommitRenewal(ctx, r)
			mustNil(t, "CommitRenewal", err)
			wantEqual(t, "counts after a renewal", countCerts(t, ctx, s), store.AgentCertificateCounts{Valid: 3, Expired: 1})
		}},
		{"a short-lived certificate expires by the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t", 0, time.Time{}, time.Hour))
			mustJoin(t, ctx, s, lifetime(newJoin("t", "n", "i", "key", now), now, now.Add(2*time.Second)))
			deadline := time.Now().Add(30 * time.Second)
			for {
				n := countCerts(t, ctx, s)
				if n.Valid+n.Expiring+n.Expired != 1 {
					t.Fatalf("counts %+v: want the one node counted once", n)
				}
				if n.Expired == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("counts %+v 30 s after a certificate of 2 s; want it expired", n)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}},
	}
}
