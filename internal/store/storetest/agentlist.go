package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

// agentByReads is an agent row as the per-node reads give it: what
// ListAgentsPage must return in one query.
func agentByReads(t *testing.T, ctx context.Context, s store.Store, id string) store.AgentRow {
	t.Helper()
	n, err := s.GetNode(ctx, id)
	mustNil(t, "GetNode", err)
	in, err := s.GetInstance(ctx, n.InstanceID)
	mustNil(t, "GetInstance", err)
	a := store.AgentRow{Node: n, Instance: in}
	a.Instance.LastChainPEM = nil
	if c, err := s.GetCertificate(ctx, in.LastSerial); err == nil {
		a.NotAfter = c.NotAfter
	}
	targets := []store.LockTarget{{Kind: store.LockNode, Target: n.ID}, {Kind: store.LockInstance, Target: in.ID}}
	if in.TokenID != "" {
		targets = append(targets, store.LockTarget{Kind: store.LockToken, Target: in.TokenID})
	}
	if l, err := s.FindAnyLock(ctx, targets); err == nil {
		a.Lock = &l
	} else if !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	if st, err := s.GetAgentStream(ctx, id); err == nil {
		a.Stream = &st
	}
	if in.JoinMethod == store.JoinMethodBoundKeypair {
		if tok, err := s.GetToken(ctx, in.TokenID); err == nil {
			a.BoundKeypair = tok.BoundKeypair
		}
	}
	return a
}

func agentListCases() []testCase {
	return []testCase{
		{"a page of agents in one query is what the per-node reads say", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("tok-a", 10, time.Time{}, time.Hour), token("tok-gone", 10, time.Time{}, time.Hour),
				bkToken("bot-1", "", 3, store.RecoveryStandard), bkToken("bot-gone", "", 3, store.RecoveryStandard))
			mustJoin(t, ctx, s, newJoin("tok-a", "a-token", "inst-a", "ka", at(0)))
			mustJoin(t, ctx, s, newJoin("", "b-psk", "inst-b", "kb", at(0)))
			mustJoin(t, ctx, s, newJoin("tok-gone", "c-gone", "inst-c", "kc", at(0)))
			mustJoin(t, ctx, s, bkJoin("bot-1", "d-bot", "inst-d", at(0), register("bot-1", "key-d")...))
			mustJoin(t, ctx, s, bkJoin("bot-gone", "e-bot-gone", "inst-e", at(0), register("bot-gone", "key-e")...))
			mustJoin(t, ctx, s, newJoin("", "f-plain", "inst-f", "kf", at(0)))
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "tok-gone", link(record("token.delete"))))
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "bot-gone", link(record("token.delete"))))
			lock := func(id, kind, target string, age, expiresIn time.Duration) {
				l := store.Lock{ID: id, Kind: kind, Target: target, Reason: "r " + id, CreatedBy: "admin", CreatedAt: now.Add(-age)}
				if expiresIn != 0 {
					l.ExpiresAt = now.Add(expiresIn)
				}
				mustNil(t, "InsertLock "+id, s.InsertLock(ctx, l, link(record("lock.create"))))
			}
			lock("on-token", store.LockToken, "tok-a", time.Hour, 0)
			// b: node, instance and an older instance lock: the node's wins.
			lock("b-instance-old", store.LockInstance, "inst-b", 3*time.Hour, 0)
			lock("b-node", store.LockNode, "b-psk", time.Hour, 0)
			lock("b-node-older", store.LockNode, "b-psk", 2*time.Hour, time.Hour)
			// c: only an expired lock.
			lock("c-expired", store.LockInstance, "inst-c", time.Hour, -time.Minute)
			lock("d-bot-token", store.LockToken, "bot-1", time.Hour, 0)
			mustNil(t, "RecordAgentStream", s.RecordAgentStream(ctx, store.AgentStream{NodeID: "a-token", Replica: "r:1", Connected: true,
				ConnectedAt: at(0), LastSeen: at(time.Second), Report: `{"v":1}`}))
			mustNil(t, "RecordAgentStream", s.RecordAgentStream(ctx, store.AgentStream{NodeID: "d-bot", Replica: "r:2", ConnectedAt: at(0), LastSeen: at(time.Minute)}))

			ids := []string{"a-token", "b-psk", "c-gone", "d-bot", "e-bot-gone", "f-plain"}
			var got []store.AgentRow
			for after := ""; ; {
				page, err := s.ListAgentsPage(ctx, after, 4)
				mustNil(t, "ListAgentsPage", err)
				got = append(got, page...)
				if len(page) < 4 {
					break
				}
				after = page[len(page)-1].Node.ID
			}
			if len(got) != len(ids) {
				t.Fatalf("ListAgentsPage: %d agents, want %d", len(got), len(ids))
			}
			for i, id := range ids {
				want := agentByReads(t, ctx, s, id)
				if diff := cmp.Diff(want, got[i], cmpOpts); diff != "" {
					t.Errorf("agent %s (-per-node reads +ListAgentsPage):\n%s", id, diff)
				}
			}
			// The fixture covers each case it means to.
			if got[1].Lock == nil || got[1].Lock.ID != "b-node-older" || got[2].Lock != nil || got[3].BoundKeypair == nil ||
				got[4].BoundKeypair != nil || got[0].Stream == nil || got[3].Lock == nil || got[0].NotAfter.IsZero() {
				t.Errorf("fixture: b's lock %v, c's lock %v, d's state %v, e's state %v, a's stream %v, d's lock %v, a's expiry %v",
					got[1].Lock, got[2].Lock, got[3].BoundKeypair, got[4].BoundKeypair, got[0].Stream, got[3].Lock, got[0].NotAfter)
			}
			for i, id := range ids {
				one, err := s.GetAgentRow(ctx, id)
				mustNil(t, "GetAgentRow", err)
				if diff := cmp.Diff(got[i], one, cmpOpts); diff != "" {
					t.Errorf("GetAgentRow %s (-ListAgentsPage +GetAgentRow):\n%s", id, diff)
				}
			}
			_, err := s.GetAgentRow(ctx, "nobody")
			wantErr(t, "GetAgentRow of no node", err, store.ErrNotFound)
			page, err := s.ListAgentsPage(ctx, "f-plain", 4)
			mustNil(t, "ListAgentsPage past the end", err)
			if len(page) != 0 {
				t.Errorf("ListAgentsPage after the last: %d agents", len(page))
			}
		}},
	}
}
