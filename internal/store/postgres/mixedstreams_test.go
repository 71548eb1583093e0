package postgres

import (
	"testing"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/storetest"
)

// oldTakeAgentStream is the release before 0027's write of an opening
// stream's row (its holder and turn encoded in stream_id), as a replica
// of that release still running during a rolling upgrade makes it.
const oldTakeAgentStream = `WITH w AS (
		INSERT INTO agent_streams (node_id, stream_id, replica, connected, connected_at, last_seen, report)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (node_id) DO UPDATE SET stream_id = excluded.stream_id, replica = excluded.replica,
			connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen,
			report = excluded.report
		WHERE agent_streams.stream_id = $10
		RETURNING 1)
	SELECT pg_notify($8, $9) FROM w`

// TestMixedStreamRows: stream rows taken in turn by replicas of the
// release before 0027 (oldTakeAgentStream) and of this one.
func TestMixedStreamRows(t *testing.T) {
	storetest.RunMixedStreamTests(t, func(t *testing.T) storetest.MixedStreamStore {
		s, _ := openFresh(t)
		return storetest.MixedStreamStore{Store: s, TakeAsBefore: func(t *testing.T, a store.AgentStream, prev string) {
			connected := 0
			if a.Connected {
				connected = 1
			}
			rows, err := s.pool.Query(t.Context(), oldTakeAgentStream, a.NodeID, a.StreamID, a.Replica, connected,
				timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report, changeChannel, changePayload(store.ChangeStream, []string{a.NodeID}), prev)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				n++
			}
			rows.Close()
			if err := rows.Err(); err != nil || n != 1 {
				t.Fatalf("the release before's take wrote %d rows (%v), want 1", n, err)
			}
		}}
	})
}
