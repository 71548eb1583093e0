package authority

import (
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestFlapAfter: the copy signal a stream row carries to the replica
// that takes it next. Only a live stream of another holder replaced is a
// replacement; one back to the holder the last turn took the row from,
// within flapWindow, continues the count; rows that name no holder count
// for nothing. The count lives in the row, one record per node, not in
// each replica's memory. A row the release before migration 0027 wrote
// during a rolling upgrade carries its holder and turn in its StreamID,
// and its columns are those of the row it replaced (that release does
// not write them): its StreamID is read, not its columns. A row still
// marked connected with no heartbeat for streamStaleAfter is a killed
// replica's (streamLive), not a live stream: taking it is no turn.
func TestFlapAfter(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 5, 0, 0, 0, time.UTC)
	ab := store.StreamTurn{From: "A", To: "B", At: t0, Count: 2}
	// Rows are heard from 30 s before t0 (an agent's heartbeat period)
	// unless a case says otherwise (heard).
	row := func(holder string, turn store.StreamTurn, connected bool) store.AgentStream {
		return store.AgentStream{StreamID: "11111111-2222-3333-4444-555555555555", Holder: holder, Turn: turn, Connected: connected,
			ConnectedAt: t0.Add(-time.Hour), LastSeen: t0.Add(-30 * time.Second)}
	}
	heard := func(r store.AgentStream, at time.Time) store.AgentStream {
		r.LastSeen = at
		return r
	}
	// As the release before 0027 writes its row over one of this
	// release's (stale holder "C" and turn in the columns).
	legacy := func(holder string, turn store.StreamTurn, connected bool) store.AgentStream {
		at := int64(0)
		if !turn.At.IsZero() {
			at = turn.At.UnixMicro()
		}
		b, err := json.Marshal(map[string]any{"h": holder, "f": turn.From, "o": turn.To, "t": at, "n": turn.Count})
		if err != nil {
			t.Fatal(err)
		}
		return store.AgentStream{StreamID: "11111111-2222-3333-4444-555555555555." + base64.RawURLEncoding.EncodeToString(b),
			Holder: "C", Turn: store.StreamTurn{From: "D", To: "C", At: t0, Count: 2}, Connected: connected,
			ConnectedAt: t0.Add(-time.Hour), LastSeen: t0.Add(-30 * time.Second)}
	}
	for _, c := range []struct {
		name   string
		prev   store.AgentStream
		found  bool
		holder string
		now    time.Time
		want   store.StreamTurn
		alt    int
	}{
		{"no row", store.AgentStream{}, false, "A", t0, store.StreamTurn{}, 0},
		{"a row naming no holder (before 0027, or before the holder was recorded)", row("", store.StreamTurn{}, true), true, "A", t0, store.StreamTurn{}, 0},
		{"the same holder reconnecting", row("B", ab, true), true, "B", t0.Add(time.Second), ab, 0},
		{"after a closed stream", row("B", ab, false), true, "A", t0.Add(time.Second), ab, 0},
		{"back to the holder replaced", row("B", ab, true), true, "A", t0.Add(time.Second),
			store.StreamTurn{From: "B", To: "A", At: t0.Add(time.Second), Count: 3}, 2},
		{"back, but after flapWindow", heard(row("B", ab, true), t0.Add(flapWindow)), true, "A", t0.Add(flapWindow + time.Second),
			store.StreamTurn{From: "B", To: "A", At: t0.Add(flapWindow + time.Second), Count: 1}, 0},
		{"over a killed replica's row (connected, no heartbeat for streamStaleAfter)", heard(row("B", ab, true), t0.Add(-time.Second)), true, "A",
			t0.Add(streamStaleAfter), ab, 0},
		{"over a killed replica's row, back to the holder replaced thrice (not a copy)",
			heard(row("B", store.StreamTurn{From: "A", To: "B", At: t0, Count: flapAlternations}, true), t0), true, "A", t0.Add(streamStaleAfter + time.Second),
			store.StreamTurn{From: "A", To: "B", At: t0, Count: flapAlternations}, 0},
		{"over a row whose heartbeat is just within streamStaleAfter", heard(row("B", ab, true), t0.Add(-streamStaleAfter)), true, "A", t0,
			store.StreamTurn{From: "B", To: "A", At: t0, Count: 3}, 2},
		{"over a killed replica's row of the release before", heard(legacy("B", ab, true), t0.Add(-streamStaleAfter-time.Second)), true, "A", t0, ab, 0},
		{"a third holder", row("B", ab, true), true, "C", t0.Add(time.Second),
			store.StreamTurn{From: "B", To: "C", At: t0.Add(time.Second), Count: 1}, 0},
		{"a row of the release before: back to the holder replaced", legacy("B", ab, true), true, "A", t0.Add(time.Second),
			store.StreamTurn{From: "B", To: "A", At: t0.Add(time.Second), Count: 3}, 2},
		{"a row of the release before: its columns are another stream's", legacy("B", ab, true), true, "C", t0.Add(time.Second),
			store.StreamTurn{From: "B", To: "C", At: t0.Add(time.Second), Count: 1}, 0},
		{"a row of the release before with no turn yet", legacy("B", store.StreamTurn{}, true), true, "A", t0.Add(time.Second),
			store.StreamTurn{From: "B", To: "A", At: t0.Add(time.Second), Count: 1}, 0},
		{"a row of the release before that does not decode", store.AgentStream{StreamID: "x.!!", Holder: "C", Turn: ab, Connected: true}, true, "A", t0,
			store.StreamTurn{}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, alt := flapAfter(c.prev, c.found, c.holder, c.now)
			if !got.At.Equal(c.want.At) || got.From != c.want.From || got.To != c.want.To || got.Count != c.want.Count || alt != c.alt {
				t.Fatalf("flapAfter = %+v, %d; want %+v, %d", got, alt, c.want, c.alt)
			}
		})
	}
}
