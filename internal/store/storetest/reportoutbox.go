package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// pendingReports lists every pending report, oldest first.
func pendingReports(t *testing.T, ctx context.Context, s store.Store) []store.PendingReport {
	t.Helper()
	rs, err := s.ListPendingReports(ctx, 1000)
	mustNil(t, "ListPendingReports", err)
	n, err := s.CountPendingReports(ctx)
	mustNil(t, "CountPendingReports", err)
	if n != int64(len(rs)) {
		t.Errorf("CountPendingReports = %d, ListPendingReports returned %d", n, len(rs))
	}
	return rs
}

// reportIDs returns the instance IDs of rs in order.
func reportIDs(rs []store.PendingReport) []string {
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.InstanceID)
	}
	return ids
}

// ticketJoin is a PSK join of node as instance, with the ticket jti.
func ticketJoin(node, instance, jti string, created time.Time) store.Join {
	return withTicket(withCredential(newJoin("", node, instance, "key-"+instance, created), "psk-1"), jti, created.Add(2*time.Minute))
}

func reportOutboxCases() []testCase {
	return []testCase{
		{"a ticket join leaves its report", func(t *testing.T, ctx context.Context, s store.Store) {
			before := storeNow(t, ctx, s)
			// The instance's creation, not the store clock, is when it
			// joined.
			j := ticketJoin("node-1", "i1", "jti-1", at(0))
			j.Audit = link(record("agent.join"))
			mustJoin(t, ctx, s, j)
			after := storeNow(t, ctx, s)
			rs := pendingReports(t, ctx, s)
			if len(rs) != 1 {
				t.Fatalf("pending reports %+v, want one", rs)
			}
			if c := rs[0].CreatedAt; c.Before(before) || c.After(after) || c.Location() != time.UTC {
				t.Errorf("CreatedAt %v, want the store clock in [%v, %v] in UTC", c, before, after)
			}
			rs[0].CreatedAt = time.Time{}
			wantEqual(t, "pending report", rs[0], store.PendingReport{InstanceID: "i1", NodeID: "node-1", TicketID: "jti-1", JoinedAt: at(0)})
		}},
		{"joins without a ticket leave none", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour))
			mustJoin(t, ctx, s, newJoin("t1", "node-1", "i1", "key-1", at(0)))
			mustJoin(t, ctx, s, withCredential(newJoin("", "node-2", "i2", "key-2", at(0)), "psk-1"))
			if rs := pendingReports(t, ctx, s); len(rs) != 0 {
				t.Errorf("pending reports %+v, want none", rs)
			}
		}},
		{"a ticket join with a token leaves its report", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour))
			mustJoin(t, ctx, s, withTicket(newJoin("t1", "node-1", "i1", "key-1", at(0)), "jti-1", at(2*time.Minute)))
			if ids := reportIDs(pendingReports(t, ctx, s)); len(ids) != 1 || ids[0] != "i1" {
				t.Errorf("pending reports %v, want [i1]", ids)
			}
		}},
		{"a retry leaves no second report", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			mustJoin(t, ctx, s, ticketJoin("node-1", "i1", "jti-1", now))
			for _, jti := range []string{"jti-1", "jti-2"} {
				j := ticketJoin("node-1", "i2", jti, now)
				j.Instance.LastPublicKey, j.Certificate.PublicKey = pubKey("key-i1"), pubKey("key-i1")
				j.RetryWindow = time.Minute
				res, err := s.CommitJoin(ctx, j)
				mustNil(t, "CommitJoin retry", err)
				if !res.Retry {
					t.Fatalf("the join with %s is not a retry: %+v", jti, res)
				}
			}
			rs := pendingReports(t, ctx, s)
			if ids := reportIDs(rs); len(ids) != 1 || ids[0] != "i1" || rs[0].TicketID != "jti-1" {
				t.Errorf("pending reports %+v, want i1's only", rs)
			}
		}},
		{"a replayed ticket leaves no report", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			mustJoin(t, ctx, s, ticketJoin("node-1", "i1", "jti-1", now))
			_, err := s.CommitJoin(ctx, ticketJoin("node-2", "i2", "jti-1", now))
			wantErr(t, "CommitJoin with a used ticket", err, store.ErrTicketReplayed)
			if ids := reportIDs(pendingReports(t, ctx, s)); len(ids) != 1 || ids[0] != "i1" {
				t.Errorf("pending reports %v, want [i1]", ids)
			}
		}},
		{"a refused join leaves no report", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			mustJoin(t, ctx, s, withCredential(newJoin("", "node-1", "i1", "key-1", now), "psk-1"))
			_, err := s.CommitJoin(ctx, ticketJoin("node-1", "i2", "jti-1", now))
			wantErr(t, "CommitJoin on a taken node", err, store.ErrNodeTaken)
			if rs := pendingReports(t, ctx, s); len(rs) != 0 {
				t.Errorf("pending reports %+v, want none", rs)
			}
			wantTicketUsed(t, ctx, s, "jti-1", false)
		}},
		{"delete", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			mustJoin(t, ctx, s, ticketJoin("node-1", "i1", "jti-1", now))
			mustJoin(t, ctx, s, ticketJoin("node-2", "i2", "jti-2", now))
			mustNil(t, "DeletePendingReport i1", s.DeletePendingReport(ctx, "i1"))
			if ids := reportIDs(pendingReports(t, ctx, s)); len(ids) != 1 || ids[0] != "i2" {
				t.Errorf("pending reports after deleting i1: %v, want [i2]", ids)
			}
			wantErr(t, "DeletePendingReport i1 again", s.DeletePendingReport(ctx, "i1"), store.ErrNotFound)
			wantErr(t, "DeletePendingReport of no report", s.DeletePendingReport(ctx, "nope"), store.ErrNotFound)
			// The join itself stays, and its ticket stays used.
			if _, err := s.GetInstance(ctx, "i1"); err != nil {
				t.Errorf("GetInstance i1 after its report was delivered: %v", err)
			}
			wantTicketUsed(t, ctx, s, "jti-1", true)
		}},
		{"list oldest first, up to the limit", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			// Joins one after the other: by the store clock (ties broken
			// by instance ID, here in the same order) i-1 is the oldest.
			// JoinedAt runs the other way, and must not decide the order.
			var want []string
			for i := 1; i <= 5; i++ {
				id := fmt.Sprint(i)
				mustJoin(t, ctx, s, ticketJoin("node-"+id, "i-"+id, "jti-"+id, now.Add(-time.Duration(i)*time.Second)))
				want = append(want, "i-"+id)
			}
			for _, tc := range []struct {
				limit int
				want  []string
			}{{1, want[:1]}, {2, want[:2]}, {5, want}, {100, want}} {
				rs, err := s.ListPendingReports(ctx, tc.limit)
				mustNil(t, "ListPendingReports", err)
				wantEqual(t, fmt.Sprintf("reports listed with limit %d", tc.limit), reportIDs(rs), tc.want)
			}
			mustNil(t, "DeletePendingReport i-1", s.DeletePendingReport(ctx, "i-1"))
			rs, err := s.ListPendingReports(ctx, 2)
			mustNil(t, "ListPendingReports", err)
			wantEqual(t, "reports after delivering the oldest", reportIDs(rs), want[1:3])
			n, err := s.CountPendingReports(ctx)
			mustNil(t, "CountPendingReports", err)
			if n != 4 {
				t.Errorf("CountPendingReports = %d, want 4", n)
			}
			for _, limit := range []int{0, -1} {
				if _, err := s.ListPendingReports(ctx, limit); err == nil {
					t.Errorf("ListPendingReports with limit %d succeeded", limit)
				}
			}
		}},
		{"concurrent ticket joins each leave one report", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			const n = 8
			errs := concurrently(n, func(i int) error {
				id := fmt.Sprint(i)
				_, err := s.CommitJoin(ctx, ticketJoin("node-"+id, "i-"+id, "jti-"+id, now))
				return err
			})
			if ok, _ := tally(t, errs, nil); ok != n {
				t.Fatalf("%d of %d joins succeeded", ok, n)
			}
			if rs := pendingReports(t, ctx, s); len(rs) != n {
				t.Errorf("%d pending reports, want %d", len(rs), n)
			}
		}},
	}
}
