package discoveryd

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/h2frames"
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
	from := fc.frames.Count()
	for range 2 {
		if _, err := h.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// A PING the client sent on the first response's DATA is answered
	// before the second response.
	got := fc.frames.Names(from)
	if want := "HEADERS DATA HEADERS+END_STREAM HEADERS DATA HEADERS+END_STREAM"; got != want {
		t.Errorf("discovery's frames for two calls on one connection: %s, want %s", got, want)
	}
}

// frameCreds records the HTTP/2 frames the server sends on the
// connection they make (one).
type frameCreds struct {
	credentials.TransportCredentials
	frames h2frames.Reader
}

func (c *frameCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	return &h2frames.Conn{Conn: conn, R: &c.frames}, info, nil
}

func (c *frameCreds) Clone() credentials.TransportCredentials { return c }
