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
	}
}
