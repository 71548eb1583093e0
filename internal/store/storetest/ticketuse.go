package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// withTicket returns j using the referral ticket jti, kept until keep.
func withTicket(j store.Join, jti string, keep time.Time) store.Join {
	j.Ticket = &store.TicketUse{ID: jti, KeepUntil: keep}
	return j
}

func wantTicketUsed(t *testing.T, ctx context.Context, s store.Store, jti string, want bool) {
	t.Helper()
	used, err := s.TicketUsed(ctx, jti)
	mustNil(t, "TicketUsed "+jti, err)
	if used != want {
		t.Errorf("TicketUsed(%s) = %v, want %v", jti, used, want)
	}
}

// ticketState is state plus the audit head: what a refused join must leave
// as it found it.
type ticketState struct {
	State state
	Head  store.AuditHead
}

func ticketSnapshot(t *testing.T, ctx context.Context, s store.Store) ticketState {
	t.Helper()
	head, err := s.AuditHead(ctx)
	mustNil(t, "AuditHead", err)
	return ticketState{snapshot(t, ctx, s, "node-1", "node-2"), head}
}

func ticketUseCases() []testCase {
	cases := []testCase{
		{"join records its ticket", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			wantTicketUsed(t, ctx, s, "jti-1", false)
			j := withTicket(withCredential(newJoin("", "node-1", "i1", "key-1", now), "psk-1"), "jti-1", now.Add(2*time.Minute))
			j.Audit = link(record("agent.join"))
			res := mustJoin(t, ctx, s, j)
			wantEqual(t, "JoinResult", res, store.JoinResult{Instance: wantInstance(j, "")})
			wantTicketUsed(t, ctx, s, "jti-1", true)
			wantTicketUsed(t, ctx, s, "jti-2", false)
		}},
		{"join without a ticket records none", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			mustJoin(t, ctx, s, withCredential(newJoin("", "node-1", "i1", "key-1", now), "psk-1"))
			wantTicketUsed(t, ctx, s, "", false)
			n, err := s.DeleteTicketUses(ctx)
			mustNil(t, "DeleteTicketUses", err)
			if n != 0 {
				t.Errorf("DeleteTicketUses = %d, want 0", n)
			}
		}},
	}

	// Each replay uses jti-1, which the join of node-1 as i1 (token t1)
	// recorded, and must fail with ErrTicketReplayed and leave everything
	// as it was: no node, no token use, no supersession, no audit record.
	replays := []struct {
		name string
		join func(now time.Time) store.Join
	}{
		{"on another node with a token", func(now time.Time) store.Join {
			return newJoin("t2", "node-2", "i2", "key-2", now)
		}},
		{"on another node with a credential", func(now time.Time) store.Join {
			return withCredential(newJoin("", "node-2", "i2", "key-2", now), "psk-1")
		}},
		{"superseding the first join's node", func(now time.Time) store.Join {
			j := newJoin("bound", "node-1", "i2", "key-2", now)
			j.MaySupersede = true
			return j
		}},
		{"on the same node, token and key, not as a retry", func(now time.Time) store.Join {
			j := newJoin("t1", "node-1", "i2", "key-1", now)
			j.MaySupersede = true
			return j
		}},
	}
	for _, rp := range replays {
		cases = append(cases, testCase{"replay " + rp.name + " writes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			bound := token("bound", 1, time.Time{}, 0)
			bound.NodeID = "node-1"
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour), token("t2", 1, time.Time{}, time.Hour), bound)
			first := withTicket(newJoin("t1", "node-1", "i1", "key-1", now), "jti-1", now.Add(2*time.Minute))
			first.Audit = link(record("agent.join"))
			mustJoin(t, ctx, s, first)

			before := ticketSnapshot(t, ctx, s)
			j := withTicket(rp.join(now), "jti-1", now.Add(2*time.Minute))
			j.Audit = link(record("agent.join"))
			_, err := s.CommitJoin(ctx, j)
			wantErr(t, "CommitJoin with a used ticket", err, store.ErrTicketReplayed)
			wantEqual(t, "state after a replayed ticket", ticketSnapshot(t, ctx, s), before)
			if _, err := s.GetInstance(ctx, "i2"); err == nil {
				t.Error("the refused join's instance was written")
			}
			wantTicketUsed(t, ctx, s, "jti-1", true)
		}})
	}

	// A retry of a lost reply presents the same ticket again (or, if the
	// agent fetched a new one, another): it is answered as a retry, and
	// records nothing.
	retries := []struct {
		name       string
		credential string
		jti        string
	}{
		{"token join, same ticket", "", "jti-1"},
		{"credential join, same ticket", "psk-1", "jti-1"},
		{"credential join, new ticket", "psk-1", "jti-2"},
	}
	for _, rt := range retries {
		cases = append(cases, testCase{"retry: " + rt.name, func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 1, time.Time{}, time.Hour))
			j1 := withTicket(withCredential(newJoin("t1", "node-1", "i1", "key-1", now), rt.credential), "jti-1", now.Add(2*time.Minute))
			first := mustJoin(t, ctx, s, j1).Instance

			before := ticketSnapshot(t, ctx, s)
			j2 := withTicket(withCredential(newJoin("t1", "node-1", "i2", "key-1", now), rt.credential), rt.jti, now.Add(2*time.Minute))
			j2.RetryWindow = time.Minute
			j2.Audit = link(record("agent.join"))
			res, err := s.CommitJoin(ctx, j2)
			mustNil(t, "CommitJoin retry", err)
			wantEqual(t, "JoinResult", res, store.JoinResult{Instance: first, Retry: true})
			wantEqual(t, "state after the retry", ticketSnapshot(t, ctx, s), before)
			wantTicketUsed(t, ctx, s, "jti-1", true)
			if rt.jti != "jti-1" {
				wantTicketUsed(t, ctx, s, rt.jti, false)
			}
		}})
	}

	return append(cases,
		testCase{"concurrent joins with one ticket: exactly one", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour))
			base := auditSeq(t, ctx, s) // the token's record
			const n = 8
			errs := concurrently(n, func(i int) error {
				id := fmt.Sprint(i)
				// Half the joins use a token, so a loser's use must be
				// rolled back with the rest of its join.
				j := withCredential(newJoin("", "node-"+id, "i-"+id, "key-"+id, now), "psk-1")
				if i%2 == 0 {
					j = newJoin("t1", "node-"+id, "i-"+id, "key-"+id, now)
				}
				j = withTicket(j, "jti-1", now.Add(2*time.Minute))
				j.Audit = link(record("agent.join"))
				_, err := s.CommitJoin(ctx, j)
				return err
			})
			ok, replayed := tally(t, errs, store.ErrTicketReplayed)
			if ok != 1 || replayed != n-1 {
				t.Errorf("%d joins succeeded and %d found the ticket used, want 1 and %d", ok, replayed, n-1)
			}
			nodes, err := s.ListNodes(ctx)
			mustNil(t, "ListNodes", err)
			if len(nodes) != 1 {
				t.Errorf("ListNodes returned %d nodes, want 1", len(nodes))
			}
			tok, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken", err)
			var uses int64 // the winner's, if it used the token
			if len(nodes) == 1 && nodes[0].TokenID == "t1" {
				uses = 1
			}
			if tok.UsesCount != uses {
				t.Errorf("UsesCount = %d, want %d", tok.UsesCount, uses)
			}
			head, err := s.AuditHead(ctx)
			mustNil(t, "AuditHead", err)
			if head.Seq != base+1 {
				t.Errorf("audit head %d, want %d", head.Seq, base+1)
			}
		}},
		testCase{"a ticket without a jti or a KeepUntil is refused", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			for _, u := range []store.TicketUse{{ID: "", KeepUntil: now.Add(time.Minute)}, {ID: "jti-1"}} {
				j := withCredential(newJoin("", "node-1", "i1", "key-1", now), "psk-1")
				j.Ticket = &u
				if _, err := s.CommitJoin(ctx, j); err == nil {
					t.Errorf("CommitJoin with ticket %+v succeeded", u)
				}
			}
			if nodes := snapshot(t, ctx, s).Nodes; len(nodes) != 0 {
				t.Fatalf("nodes written: %+v", nodes)
			}
			wantTicketUsed(t, ctx, s, "jti-1", false)
		}},
		testCase{"delete ticket uses past KeepUntil by the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			keep := map[string]time.Time{
				"jti-past": now.Add(-time.Minute), "jti-now": now, "jti-future": now.Add(time.Hour),
			}
			i := 0
			for jti, until := range keep {
				i++
				id := fmt.Sprint(i)
				mustJoin(t, ctx, s, withTicket(withCredential(newJoin("", "node-"+id, "i-"+id, "key-"+id, now), "psk-1"), jti, until))
			}
			n, err := s.DeleteTicketUses(ctx)
			mustNil(t, "DeleteTicketUses", err)
			if n != 2 {
				t.Errorf("DeleteTicketUses = %d, want 2", n)
			}
			wantTicketUsed(t, ctx, s, "jti-past", false)
			wantTicketUsed(t, ctx, s, "jti-now", false)
			wantTicketUsed(t, ctx, s, "jti-future", true)
			n, err = s.DeleteTicketUses(ctx)
			mustNil(t, "DeleteTicketUses again", err)
			if n != 0 {
				t.Errorf("second DeleteTicketUses = %d, want 0", n)
			}
		}},
	)
}
