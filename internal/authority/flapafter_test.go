package authority

import (
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestFlapAfter: the copy signal a stream row carries to the replica
// that takes it next. Only a live stream of another holder replaced is a
// replacement; one back to the holder the last replacement took the row
// from, within flapWindow, continues the count; rows of older replicas
// (a bare stream name) and rows that do not decode count for nothing.
// The count lives in the row, one record per node, not in each
// replica's memory.
func TestFlapAfter(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 5, 0, 0, 0, time.UTC)
	row := func(h streamHolder, connected bool) store.AgentStream {
		return store.AgentStream{StreamID: "11111111-2222-3333-4444-555555555555." + h.encode(), Connected: connected}
	}
	ab := streamHolder{Holder: "B", From: "A", To: "B", At: t0.UnixMicro(), Count: 2}
	for _, c := range []struct {
		name   string
		prev   store.AgentStream
		found  bool
		holder string
		now    time.Time
		want   streamHolder
		alt    int
	}{
		{"no row", store.AgentStream{}, false, "A", t0, streamHolder{Holder: "A"}, 0},
		{"a row of an older replica", store.AgentStream{StreamID: "11111111-2222-3333-4444-555555555555", Connected: true}, true, "A", t0, streamHolder{Holder: "A"}, 0},
		{"a row that does not decode", store.AgentStream{StreamID: "x.!!", Connected: true}, true, "A", t0, streamHolder{Holder: "A"}, 0},
		{"the same holder reconnecting", row(ab, true), true, "B", t0.Add(time.Second),
			streamHolder{Holder: "B", From: "A", To: "B", At: t0.UnixMicro(), Count: 2}, 0},
		{"after a closed stream", row(ab, false), true, "A", t0.Add(time.Second),
			streamHolder{Holder: "A", From: "A", To: "B", At: t0.UnixMicro(), Count: 2}, 0},
		{"back to the holder replaced", row(ab, true), true, "A", t0.Add(time.Second),
			streamHolder{Holder: "A", From: "B", To: "A", At: t0.Add(time.Second).UnixMicro(), Count: 3}, 2},
		{"back, but after flapWindow", row(ab, true), true, "A", t0.Add(flapWindow + time.Second),
			streamHolder{Holder: "A", From: "B", To: "A", At: t0.Add(flapWindow + time.Second).UnixMicro(), Count: 1}, 0},
		{"a third holder", row(ab, true), true, "C", t0.Add(time.Second),
			streamHolder{Holder: "C", From: "B", To: "C", At: t0.Add(time.Second).UnixMicro(), Count: 1}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, alt := flapAfter(c.prev, c.found, c.holder, c.now)
			if got != c.want || alt != c.alt {
				t.Fatalf("flapAfter = %+v, %d; want %+v, %d", got, alt, c.want, c.alt)
			}
			if back, ok := holderOf("id." + got.encode()); !ok || back != got {
				t.Fatalf("the row's holder reads back as %+v (%v), want %+v", back, ok, got)
			}
		})
	}
}
