// Package h2frames splits the bytes a peer sends on an HTTP/2 connection
// into frames, for tests that pin what a server writes per call (which
// frames, with which flags, where each ends): wrap the client's side of
// the connection, above TLS, in a Conn.
package h2frames

import (
	"net"
	"strings"
	"sync"

	"golang.org/x/net/http2"
)

// headerLen is an HTTP/2 frame header's length (RFC 9113, 4.1).
const headerLen = 9

// Frame is one frame's header, and the offset in the stream where the
// frame ends.
type Frame struct {
	Type  http2.FrameType
	Flags http2.Flags
	End   int
}

// Name is the frame's type, with +ACK on an acknowledging SETTINGS or
// PING and +END_STREAM on a HEADERS or DATA ending its stream.
func (f Frame) Name() string {
	s := f.Type.String()
	if f.Type == http2.FrameSettings && f.Flags.Has(http2.FlagSettingsAck) || f.Type == http2.FramePing && f.Flags.Has(http2.FlagPingAck) {
		s += "+ACK"
	}
	if (f.Type == http2.FrameHeaders || f.Type == http2.FrameData) && f.Flags.Has(http2.FlagHeadersEndStream) {
		s += "+END_STREAM"
	}
	return s
}

// Reader is the frames of one direction of a connection, read as its
// bytes come (Read may return any part of a frame). It is safe for
// concurrent use: the connection's reader feeds it, a test reads it.
type Reader struct {
	mu     sync.Mutex
	frames []Frame
	head   []byte // a frame header read in part
	left   int    // bytes of the current frame's payload still to come
	read   int    // bytes read, from the start
}

// Feed reads b, the next bytes of the stream.
func (r *Reader) Feed(b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(b) > 0 {
		if r.left > 0 {
			n := min(r.left, len(b))
			r.left -= n
			r.read += n
			b = b[n:]
			continue
		}
		n := min(headerLen-len(r.head), len(b))
		r.head = append(r.head, b[:n]...)
		r.read += n
		b = b[n:]
		if len(r.head) == headerLen {
			length := int(r.head[0])<<16 | int(r.head[1])<<8 | int(r.head[2])
			r.frames = append(r.frames, Frame{Type: http2.FrameType(r.head[3]), Flags: http2.Flags(r.head[4]), End: r.read + length})
			r.left, r.head = length, r.head[:0]
		}
	}
}

// Count is how many frames have begun.
func (r *Reader) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.frames)
}

// Frames are the frames from the from-th on.
func (r *Reader) Frames(from int) []Frame {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Frame(nil), r.frames[from:]...)
}

// Names are the Names of the frames from the from-th on, space-separated.
func (r *Reader) Names(from int) string {
	var names []string
	for _, f := range r.Frames(from) {
		names = append(names, f.Name())
	}
	return strings.Join(names, " ")
}

// Read is how many bytes have been read, and whether a frame is read in
// part (its header or payload not all there).
func (r *Reader) Read() (n int, partial bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.read, r.left > 0 || len(r.head) > 0
}

// Conn is a connection whose reads R records.
type Conn struct {
	net.Conn
	R *Reader
}

func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.R.Feed(b[:n])
	return n, err
}
