package sqlite

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/storetest"
)

// oldTakeAgentStream is the release before 0027's write of an opening
// stream's row (its holder and turn encoded in stream_id), as a replica
// of that release still running during a rolling upgrade makes it.
const oldTakeAgentStream = `INSERT INTO agent_streams (node_id, stream_id, replica, connected, connected_at, last_seen, report)
	VALUES (?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (node_id) DO UPDATE SET stream_id = excluded.stream_id, replica = excluded.replica,
		connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen,
		report = excluded.report
	WHERE agent_streams.stream_id = ?`

// TestMigration0027StreamRowsOfTheReleaseBefore: a stream row the release
// before 0027 wrote reads after the migration with its stream_id whole
// and no holder or turn (the authority reads them from the stream_id);
// and one such a release writes during a rolling upgrade, over a row of
// this release, leaves the holder and turn columns as they were, which
// its stream_id (NAME.HOLDER, with a dot) tells apart: the store's
// contract (store.AgentStream.StreamID).
// Not parallel: it narrows the package's migrations while the old store
// is made.
func TestMigration0027StreamRowsOfTheReleaseBefore(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "muster.db")
	old := openBefore(t, path, 27)
	if _, err := old.w.ExecContext(ctx, oldTakeAgentStream, "n1", "s1.eyJoIjoiQSJ9", "a:1", 1, 1000, 2000, `{"v":1}`, ""); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	got, err := s.GetAgentStream(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	want := store.AgentStream{NodeID: "n1", StreamID: "s1.eyJoIjoiQSJ9", Replica: "a:1", Connected: true,
		ConnectedAt: micros(1000), LastSeen: micros(2000), Report: `{"v":1}`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("a row of the release before, after 0027 (-want +got):\n%s", diff)
	}

	// This release's stream takes the row; then one of the release
	// before takes it back.
	mine := store.AgentStream{NodeID: "n1", StreamID: "s2", Replica: "b:1", Connected: true, ConnectedAt: micros(3000),
		LastSeen: micros(3000), Holder: "B", Turn: store.StreamTurn{From: "A", To: "B", At: micros(3000), Count: 1}}
	if err := s.TakeAgentStream(ctx, mine, got.StreamID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, oldTakeAgentStream, "n1", "s3.eyJoIjoiQSJ9", "a:1", 1, 4000, 4000, "", "s2"); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetAgentStream(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if got.StreamID != "s3.eyJoIjoiQSJ9" || got.Holder != mine.Holder || got.Turn != mine.Turn {
		t.Fatalf("after a write of the release before: %+v; want its stream_id, and the columns as s2 left them", got)
	}
}

func micros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// TestMixedStreamRows: stream rows taken in turn by replicas of the
// release before 0027 (oldTakeAgentStream) and of this one.
func TestMixedStreamRows(t *testing.T) {
	storetest.RunMixedStreamTests(t, func(t *testing.T) storetest.MixedStreamStore {
		s, _ := openTemp(t)
		return storetest.MixedStreamStore{Store: s, TakeAsBefore: func(t *testing.T, a store.AgentStream, prev string) {
			connected := 0
			if a.Connected {
				connected = 1
			}
			res, err := s.w.ExecContext(t.Context(), oldTakeAgentStream, a.NodeID, a.StreamID, a.Replica, connected,
				timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report, prev)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				t.Fatalf("the release before's take wrote %d rows (%v), want 1", n, err)
			}
		}}
	})
}
