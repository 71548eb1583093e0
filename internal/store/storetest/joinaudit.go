package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// joinAuditCases: a join's or renewal's audit record is written in the
// same transaction as the change, so both are durable or neither is.
func joinAuditCases() []testCase {
	head := func(t *testing.T, ctx context.Context, s store.Store) int64 {
		t.Helper()
		h, err := s.AuditHead(ctx)
		mustNil(t, "AuditHead", err)
		return h.Seq
	}
	return []testCase{
		{"join appends its record", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, now.Add(time.Hour), time.Hour))
			base := head(t, ctx, s) // the token's record
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			j.Audit = link(record("agent.join"))
			mustJoin(t, ctx, s, j)
			if got := head(t, ctx, s); got != base+1 {
				t.Fatalf("audit head after a join = %d, want %d", got, base+1)
			}
		}},
		{"refused join appends nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, now.Add(time.Hour), time.Hour), token("t2", 1, now.Add(time.Hour), time.Hour))
			mustJoin(t, ctx, s, newJoin("t1", "node-1", "i1", "key-1", now))
			base := head(t, ctx, s) // the tokens' records
			j := newJoin("t2", "node-1", "i2", "key-2", now)
			j.Audit = link(record("agent.join"))
			if _, err := s.CommitJoin(ctx, j); !errors.Is(err, store.ErrNodeTaken) {
				t.Fatalf("CommitJoin = %v, want ErrNodeTaken", err)
			}
			if got := head(t, ctx, s); got != base {
				t.Fatalf("audit head after a refused join = %d, want %d", got, base)
			}
		}},
		{"failing audit build undoes the join", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, now.Add(time.Hour), time.Hour))
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			boom := errors.New("boom")
			j.Audit = func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, boom }
			if _, err := s.CommitJoin(ctx, j); !errors.Is(err, boom) {
				t.Fatalf("CommitJoin = %v, want the build error", err)
			}
			if _, err := s.GetNode(ctx, "node-1"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("node written although its audit record failed: %v", err)
			}
			tok, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken", err)
			if tok.UsesCount != 0 {
				t.Fatalf("token use kept although the join failed")
			}
		}},
		{"renewal appends its record", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, now.Add(time.Hour), time.Hour))
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			mustJoin(t, ctx, s, j)
			base := head(t, ctx, s) // the token's record
			r := store.Renewal{InstanceID: "i1", FromGeneration: 0, ChainPEM: []byte("chain-1"), Audit: link(record("agent.renew")),
				Certificate: store.Certificate{Serial: serial("r1"), PublicKey: pubKey("key-2"), NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}
			_, err := s.CommitRenewal(ctx, r)
			mustNil(t, "CommitRenewal", err)
			if got := head(t, ctx, s); got != base+1 {
				t.Fatalf("audit head after a renewal = %d, want %d", got, base+1)
			}
			if _, err := s.CommitRenewal(ctx, r); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("second renewal from generation 0 = %v, want ErrConflict", err)
			}
			if got := head(t, ctx, s); got != base+1 {
				t.Fatalf("audit head after a refused renewal = %d, want %d", got, base+1)
			}
		}},
		{"superseding joins racing renewals of the instance they replace, all audited", func(t *testing.T, ctx context.Context, s store.Store) {
			// A join supersedes the node's instance (its row lock) and then
			// takes the chain's lock; a renewal of that instance holds its
			// row and then takes the chain's lock. Every writer takes row
			// locks before the chain's, so the two never wait on each other
			// in a cycle: each ends in its own outcome, none in a deadlock
			// or an error of the database.
			now := storeNow(t, ctx, s)
			bound := token("t1", 0, time.Time{}, time.Hour)
			bound.NodeID = "node-1"
			insertTokens(t, ctx, s, bound)
			first := mustJoin(t, ctx, s, newJoin("t1", "node-1", "i0", "key-0", now)).Instance
			// Records first, so that a store that builds a record on its
			// own previous append's (postgres, once a few appends in a row
			// found their own at the head) does so in the race.
			const warm = 8
			base := head(t, ctx, s) // the token's record
			appendN(t, ctx, s, warm)
			const n = 6
			errs := concurrently(2*n, func(i int) error {
				if i%2 == 0 {
					j := newJoin("t1", "node-1", fmt.Sprintf("i%d", i+1), fmt.Sprintf("key-%d", i+1), now)
					j.MaySupersede = true
					j.Audit = link(record("agent.join"))
					_, err := s.CommitJoin(ctx, j)
					return err
				}
				r := renewalOf(first, fmt.Sprintf("renew-%d", i), now)
				r.Audit = link(record("agent.renew"))
				_, err := s.CommitRenewal(ctx, r)
				return err
			})
			var joined, renewed int
			for i, err := range errs {
				switch {
				case err == nil && i%2 == 0:
					joined++
				case err == nil:
					renewed++
				case i%2 == 1 && errors.Is(err, store.ErrConflict):
				default:
					t.Errorf("writer %d: %v", i, err)
				}
			}
			if joined != n || renewed > 1 {
				t.Fatalf("%d joins and %d renewals succeeded, want %d joins and at most one renewal", joined, renewed, n)
			}
			if got := head(t, ctx, s); got != base+int64(warm+joined+renewed) {
				t.Fatalf("audit head %d after %d records, %d joins and %d renewals", got, warm, joined, renewed)
			}
			insts, err := s.ListInstances(ctx, "node-1")
			mustNil(t, "ListInstances", err)
			current := 0
			for _, in := range insts {
				if in.State == store.InstanceCurrent {
					current++
				}
			}
			if len(insts) != n+1 || current != 1 {
				t.Fatalf("%d instances, %d current; want %d, one current", len(insts), current, n+1)
			}
		}},
	}
}
