package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

// MixedStreamStore is a store on which a replica of the release before
// migration 0027 still writes stream rows during a rolling upgrade:
// TakeAsBefore writes a's row (NodeID, StreamID, Replica, Connected,
// ConnectedAt, LastSeen, Report) over stream prev's with that release's
// statement, which names none of the holder and turn columns.
type MixedStreamStore struct {
	store.Store
	TakeAsBefore func(t *testing.T, a store.AgentStream, prev string)
}

// RunMixedStreamTests checks what a stream row reads as while replicas
// of the release before 0027 and of this one take it in turn: each
// replica's stream replaces the other's (both compare stream_id whole),
// heartbeats go to the row's stream, and a row the release before wrote
// keeps the holder and turn columns of the row it replaced, while its
// StreamID (NAME.HOLDER, with a dot) says whose it is
// (store.AgentStream.StreamID). open returns a fresh store.
func RunMixedStreamTests(t *testing.T, open func(t *testing.T) MixedStreamStore) {
	t.Helper()
	ctx := t.Context()
	s := open(t)
	a, b := "10.0.0.1 (certificate 7)", "10.0.0.2 (certificate 7)"
	mine := store.AgentStream{NodeID: "n1", StreamID: "s1", Replica: "new:1", Connected: true, ConnectedAt: at(0), LastSeen: at(0),
		Holder: a, Turn: store.StreamTurn{From: b, To: a, At: at(0), Count: 2}}
	mustNil(t, "TakeAgentStream", s.TakeAgentStream(ctx, mine, ""))

	old := store.AgentStream{NodeID: "n1", StreamID: "s2.eyJoIjoiMTAuMC4wLjIifQ", Replica: "old:1", Connected: true,
		ConnectedAt: at(time.Second), LastSeen: at(time.Second)}
	s.TakeAsBefore(t, old, "s1")
	got, err := s.GetAgentStream(ctx, "n1")
	mustNil(t, "GetAgentStream", err)
	want := old
	want.Holder, want.Turn = mine.Holder, mine.Turn
	if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
		t.Fatalf("a row of the release before over this release's (-want +got):\n%s", diff)
	}
	// Only the old stream's heartbeats are its row's now.
	wantErr(t, "RecordAgentHeartbeat of the replaced stream", s.RecordAgentHeartbeat(ctx, store.AgentStream{NodeID: "n1", StreamID: "s1", LastSeen: at(2 * time.Second)}), store.ErrConflict)
	mustNil(t, "RecordAgentHeartbeat of the old release's stream", s.RecordAgentHeartbeat(ctx, store.AgentStream{NodeID: "n1", StreamID: old.StreamID, LastSeen: at(2 * time.Second)}))

	// This release's stream takes it back, over the name it read, with
	// its own holder and turn.
	back := store.AgentStream{NodeID: "n1", StreamID: "s3", Replica: "new:1", Connected: true, ConnectedAt: at(3 * time.Second), LastSeen: at(3 * time.Second),
		Holder: a, Turn: store.StreamTurn{From: b, To: a, At: at(3 * time.Second), Count: 1}}
	mustNil(t, "TakeAgentStream of the old release's stream", s.TakeAgentStream(ctx, back, old.StreamID))
	got, err = s.GetAgentStream(ctx, "n1")
	mustNil(t, "GetAgentStream", err)
	if diff := cmp.Diff(back, got, cmpOpts); diff != "" {
		t.Fatalf("this release's row over the release before's (-want +got):\n%s", diff)
	}
}
