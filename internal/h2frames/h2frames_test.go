package h2frames

import (
	"bytes"
	"testing"

	"golang.org/x/net/http2"
)

// TestFeedSplitAnywhere: the frames written by x/net/http2's framer are
// read back with their types, flags and ends however the bytes are split
// between reads, and a frame read in part is said to be.
func TestFeedSplitAnywhere(t *testing.T) {
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	var ends []int
	write := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, buf.Len())
	}
	write(fr.WriteSettings())
	write(fr.WriteSettingsAck())
	write(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("hdr"), EndHeaders: true}))
	write(fr.WriteData(1, false, bytes.Repeat([]byte("d"), 300)))
	write(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("trailer"), EndHeaders: true, EndStream: true}))
	write(fr.WritePing(true, [8]byte{}))
	b := buf.Bytes()
	const want = "SETTINGS SETTINGS+ACK HEADERS DATA HEADERS+END_STREAM PING+ACK"
	for split := range len(b) + 1 {
		var r Reader
		r.Feed(b[:split])
		r.Feed(b[split:])
		if got := r.Names(0); got != want {
			t.Fatalf("split at %d: %s, want %s", split, got, want)
		}
		for i, f := range r.Frames(0) {
			if f.End != ends[i] {
				t.Fatalf("split at %d: frame %d ends at %d, want %d", split, i, f.End, ends[i])
			}
		}
		if n, partial := r.Read(); n != len(b) || partial {
			t.Fatalf("split at %d: read %d (partial %v), want %d whole", split, n, partial, len(b))
		}
	}
	var r Reader
	r.Feed(b[:ends[2]+4])
	if got, _ := r.Read(); got != ends[2]+4 || r.Count() != 3 || r.Names(2) != "HEADERS" {
		t.Fatalf("read %d, %d frames %q", got, r.Count(), r.Names(0))
	}
	if _, partial := r.Read(); !partial {
		t.Error("a frame header read in part: want partial")
	}
}
