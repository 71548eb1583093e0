package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

func agentStreamCases() []testCase {
	return []testCase{
		{"record, replace, close only the same stream", func(t *testing.T, ctx context.Context, s store.Store) {
			_, err := s.GetAgentStream(ctx, "n1")
			wantErr(t, "GetAgentStream before", err, store.ErrNotFound)
			first := store.AgentStream{NodeID: "n1", StreamID: "s1", Replica: "a:1", Connected: true, ConnectedAt: at(0), LastSeen: at(time.Second), Report: `{"v":1}`}
			mustNil(t, "RecordAgentStream", s.RecordAgentStream(ctx, first))
			got, err := s.GetAgentStream(ctx, "n1")
			mustNil(t, "GetAgentStream", err)
			if diff := cmp.Diff(first, got, cmpOpts); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
			// The agent reconnects to another replica; the first stream's
			// late close does not mark the new one closed.
			second := store.AgentStream{NodeID: "n1", StreamID: "s2", Replica: "b:1", Connected: true, ConnectedAt: at(time.Minute), LastSeen: at(time.Minute)}
			mustNil(t, "RecordAgentStream again", s.RecordAgentStream(ctx, second))
			mustNil(t, "CloseAgentStream stale", s.CloseAgentStream(ctx, "n1", first.ConnectedAt, at(2*time.Minute)))
			if got, _ := s.GetAgentStream(ctx, "n1"); !got.Connected || got.Replica != "b:1" {
				t.Fatalf("a stale close changed the row: %+v", got)
			}
			mustNil(t, "CloseAgentStream", s.CloseAgentStream(ctx, "n1", second.ConnectedAt, at(3*time.Minute)))
			if got, _ := s.GetAgentStream(ctx, "n1"); got.Connected || !got.LastSeen.Equal(at(3*time.Minute)) {
				t.Fatalf("after close: %+v", got)
			}
			mustNil(t, "CloseAgentStream unknown", s.CloseAgentStream(ctx, "n9", at(0), at(0)))
		}},
		{"take replaces only the stream read", func(t *testing.T, ctx context.Context, s store.Store) {
			first := store.AgentStream{NodeID: "n1", StreamID: "s1", Replica: "a:1", Connected: true, ConnectedAt: at(0), LastSeen: at(0)}
			mustNil(t, "TakeAgentStream with no row", s.TakeAgentStream(ctx, first, ""))
			second := store.AgentStream{NodeID: "n1", StreamID: "s2", Replica: "b:1", Connected: true, ConnectedAt: at(time.Second), LastSeen: at(time.Second)}
			mustNil(t, "TakeAgentStream of s1", s.TakeAgentStream(ctx, second, "s1"))
			// Two opening at once read s2: the second to write loses.
			third := store.AgentStream{NodeID: "n1", StreamID: "s3", Replica: "a:1", Connected: true, ConnectedAt: at(2 * time.Second), LastSeen: at(2 * time.Second)}
			mustNil(t, "TakeAgentStream of s2", s.TakeAgentStream(ctx, third, "s2"))
			late := store.AgentStream{NodeID: "n1", StreamID: "s4", Replica: "b:1", Connected: true, ConnectedAt: at(3 * time.Second), LastSeen: at(3 * time.Second)}
			wantErr(t, "TakeAgentStream of a replaced stream", s.TakeAgentStream(ctx, late, "s2"), store.ErrConflict)
			wantErr(t, "TakeAgentStream as if there were no row", s.TakeAgentStream(ctx, late, ""), store.ErrConflict)
			got, err := s.GetAgentStream(ctx, "n1")
			mustNil(t, "GetAgentStream", err)
			if diff := cmp.Diff(third, got, cmpOpts); diff != "" {
				t.Fatalf("a refused take changed the row (-want +got):\n%s", diff)
			}
		}},
		{"a take over a row that is gone writes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			// A stream read s1's row, which is gone before it writes (a
			// store restored from an older backup, a row removed by
			// hand): it does not write the node's row back from its
			// read, with the turn it carried on from it. Before, the
			// take inserted the row.
			opening := store.AgentStream{NodeID: "n1", StreamID: "s2", Replica: "b:1", Connected: true, ConnectedAt: at(time.Second), LastSeen: at(time.Second),
				Holder: "10.0.0.2 (certificate 7)", Turn: store.StreamTurn{From: "10.0.0.1 (certificate 7)", To: "10.0.0.2 (certificate 7)", At: at(time.Second), Count: 2}}
			wantErr(t, "TakeAgentStream of a stream whose row is gone", s.TakeAgentStream(ctx, opening, "s1"), store.ErrConflict)
			_, err := s.GetAgentStream(ctx, "n1")
			wantErr(t, "GetAgentStream after the refused take", err, store.ErrNotFound)
			// Read again, there is no row: the stream opens as the node's
			// first, carrying no turn.
			opening.Turn = store.StreamTurn{}
			mustNil(t, "TakeAgentStream of no row", s.TakeAgentStream(ctx, opening, ""))
			got, err := s.GetAgentStream(ctx, "n1")
			mustNil(t, "GetAgentStream", err)
			if diff := cmp.Diff(opening, got, cmpOpts); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		}},
		{"the holder and the turn are written with the row, and only with it", func(t *testing.T, ctx context.Context, s store.Store) {
			a, b := "10.0.0.1 (certificate 7)", "10.0.0.2 (certificate 7)"
			first := store.AgentStream{NodeID: "n1", StreamID: "s1", Replica: "a:1", Connected: true, ConnectedAt: at(0), LastSeen: at(0), Holder: a}
			mustNil(t, "TakeAgentStream with no row", s.TakeAgentStream(ctx, first, ""))
			second := store.AgentStream{NodeID: "n1", StreamID: "s2", Replica: "b:1", Connected: true, ConnectedAt: at(time.Second), LastSeen: at(time.Second),
				Holder: b, Turn: store.StreamTurn{From: a, To: b, At: at(time.Second), Count: 1}}
			mustNil(t, "TakeAgentStream of s1", s.TakeAgentStream(ctx, second, "s1"))
			// A take that loses the race writes neither.
			lost := store.AgentStream{NodeID: "n1", StreamID: "s3", Replica: "a:1", Connected: true, ConnectedAt: at(2 * time.Second), LastSeen: at(2 * time.Second),
				Holder: a, Turn: store.StreamTurn{From: b, To: a, At: at(2 * time.Second), Count: 2}}
			wantErr(t, "TakeAgentStream of a replaced stream", s.TakeAgentStream(ctx, lost, "s1"), store.ErrConflict)
			// Heartbeats and the end leave them.
			mustNil(t, "RecordAgentHeartbeat", s.RecordAgentHeartbeat(ctx, store.AgentStream{NodeID: "n1", StreamID: "s2", LastSeen: at(3 * time.Second), Report: `{"v":1}`}))
			mustNil(t, "CloseAgentStream", s.CloseAgentStream(ctx, "n1", second.ConnectedAt, at(4*time.Second)))
			got, err := s.GetAgentStream(ctx, "n1")
			mustNil(t, "GetAgentStream", err)
			want := second
			want.Connected, want.LastSeen, want.Report = false, at(4*time.Second), `{"v":1}`
			if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
			// A stream written whole, without them, clears them.
			third := store.AgentStream{NodeID: "n1", StreamID: "s3", Replica: "a:1", Connected: true, ConnectedAt: at(5 * time.Second), LastSeen: at(5 * time.Second)}
			mustNil(t, "RecordAgentStream", s.RecordAgentStream(ctx, third))
			if got, _ := s.GetAgentStream(ctx, "n1"); got.Holder != "" || got.Turn != (store.StreamTurn{}) {
				t.Fatalf("RecordAgentStream without a holder or turn left %q, %+v", got.Holder, got.Turn)
			}
		}},
		{"only the stream that holds the row records heartbeats", func(t *testing.T, ctx context.Context, s store.Store) {
			hb := store.AgentStream{NodeID: "n1", StreamID: "s1", LastSeen: at(time.Second), Report: `{"v":1}`}
			wantErr(t, "RecordAgentHeartbeat before any stream", s.RecordAgentHeartbeat(ctx, hb), store.ErrNotFound)
			first := store.AgentStream{NodeID: "n1", StreamID: "s1", Replica: "a:1", Connected: true, ConnectedAt: at(0), LastSeen: at(0)}
			mustNil(t, "RecordAgentStream", s.RecordAgentStream(ctx, first))
			mustNil(t, "RecordAgentHeartbeat", s.RecordAgentHeartbeat(ctx, hb))
			got, err := s.GetAgentStream(ctx, "n1")
			mustNil(t, "GetAgentStream", err)
			want := first
			want.LastSeen, want.Report = hb.LastSeen, hb.Report
			if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
				t.Fatalf("after a heartbeat (-want +got):\n%s", diff)
			}
			// A newer stream of the same agent, on another replica, takes
			// the row: the first stream's heartbeats no longer write it
			// (before, each heartbeat took the row back).
			second := store.AgentStream{NodeID: "n1", StreamID: "s2", Replica: "b:1", Connected: true, ConnectedAt: at(time.Minute), LastSeen: at(time.Minute)}
			mustNil(t, "RecordAgentStream newer", s.RecordAgentStream(ctx, second))
			hb.LastSeen = at(2 * time.Minute)
			wantErr(t, "RecordAgentHeartbeat of the replaced stream", s.RecordAgentHeartbeat(ctx, hb), store.ErrConflict)
			if got, _ := s.GetAgentStream(ctx, "n1"); got.StreamID != "s2" || got.Replica != "b:1" || !got.LastSeen.Equal(at(time.Minute)) {
				t.Fatalf("a replaced stream's heartbeat changed the row: %+v", got)
			}
			// Once its end is recorded, a stream records no heartbeat.
			mustNil(t, "CloseAgentStream", s.CloseAgentStream(ctx, "n1", second.ConnectedAt, at(3*time.Minute)))
			wantErr(t, "RecordAgentHeartbeat after the end", s.RecordAgentHeartbeat(ctx, store.AgentStream{NodeID: "n1", StreamID: "s2", LastSeen: at(4 * time.Minute)}), store.ErrConflict)
		}},
		{"store reapply closes the restored rows marked connected, with its record", func(t *testing.T, ctx context.Context, s store.Store) {
			rows := []store.AgentStream{
				{NodeID: "n1", StreamID: "s1", Replica: "a:1", Connected: true, ConnectedAt: at(0), LastSeen: at(time.Minute)},
				{NodeID: "n2", StreamID: "s2", Replica: "b:1", Connected: true, ConnectedAt: at(time.Second), LastSeen: at(time.Second)},
				{NodeID: "n3", StreamID: "s3", Replica: "a:1", ConnectedAt: at(0), LastSeen: at(2 * time.Minute)},
			}
			for _, r := range rows {
				mustNil(t, "RecordAgentStream "+r.NodeID, s.RecordAgentStream(ctx, r))
			}
			read := func() any {
				var got []store.AgentStream
				for _, r := range rows {
					row, err := s.GetAgentStream(ctx, r.NodeID)
					mustNil(t, "GetAgentStream "+r.NodeID, err)
					got = append(got, row)
				}
				return got
			}
			wantUnaudited(t, ctx, s, "store.reapply", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.CloseRestoredStreams(ctx, audit)
				return err
			}, read)
			seq := auditSeq(t, ctx, s)
			n, err := s.CloseRestoredStreams(ctx, link(record("store.reapply")))
			mustNil(t, "CloseRestoredStreams", err)
			if n != 2 {
				t.Errorf("CloseRestoredStreams marked %d rows, want the 2 marked connected", n)
			}
			wantAppended(t, ctx, s, seq, "store.reapply")
			want := []store.AgentStream{rows[0], rows[1], rows[2]}
			want[0].Connected, want[1].Connected = false, false // last seen as they were
			wantEqual(t, "rows after", read(), any(want))
			// None left marked connected: nothing written, no record.
			_, err = s.CloseRestoredStreams(ctx, link(record("store.reapply")))
			wantErr(t, "CloseRestoredStreams again", err, store.ErrNotFound)
			if got := auditSeq(t, ctx, s); got != seq+1 {
				t.Errorf("audit chain holds %d records after a close that found none; want %d", got, seq+1)
			}
		}},
	}
}
