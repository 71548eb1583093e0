package discoveryd

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/h2window"
)

// TestNoPingAckPerCall: a client dialling as discoveryclient.Dial does
// keeps fixed HTTP/2 windows, so it sends no PING after a response for
// discovery to read and answer; two calls on one connection get their
// responses' frames and nothing else.
func TestNoPingAckPerCall(t *testing.T) {
	e := start(t)
	tc, err := discoveryclient.TLSConfig(e.srv.Fingerprint())
	if err != nil {
		t.Fatal(err)
	}
	fc := &frameCreds{TransportCredentials: credentials.NewTLS(tc)}
	conn, err := grpc.NewClient(e.addr, append(h2window.DialOptions(), grpc.WithTransportCredentials(fc))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	if _, err := h.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	from := fc.count()
	for range 2 {
		if _, err := h.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// A PING the client sent on the first response's DATA is answered
	// before the second response.
	got := fc.since(from)
	if want := "HEADERS DATA HEADERS HEADERS DATA HEADERS"; got != want {
		t.Errorf("discovery's frames for two calls on one connection: %s, want %s", got, want)
	}
}

// frameCreds records the types of the HTTP/2 frames the server sends on
// the connection they make (one).
type frameCreds struct {
	credentials.TransportCredentials
	mu     sync.Mutex
	frames []http2.FrameType
	head   []byte
	left   int
}

func (c *frameCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	return &frameReader{Conn: conn, c: c}, info, nil
}

func (c *frameCreds) Clone() credentials.TransportCredentials { return c }

func (c *frameCreds) read(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(b) > 0 {
		if c.left > 0 {
			n := min(c.left, len(b))
			c.left -= n
			b = b[n:]
			continue
		}
		n := min(9-len(c.head), len(b))
		c.head = append(c.head, b[:n]...)
		b = b[n:]
		if len(c.head) == 9 {
			c.frames = append(c.frames, http2.FrameType(c.head[3]))
			c.left, c.head = int(c.head[0])<<16|int(c.head[1])<<8|int(c.head[2]), c.head[:0]
		}
	}
}

func (c *frameCreds) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.frames)
}

func (c *frameCreds) since(from int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for _, f := range c.frames[from:] {
		names = append(names, f.String())
	}
	return strings.Join(names, " ")
}

type frameReader struct {
	net.Conn
	c *frameCreds
}

func (r *frameReader) Read(b []byte) (int, error) {
	n, err := r.Conn.Read(b)
	r.c.read(b[:n])
	return n, err
}
