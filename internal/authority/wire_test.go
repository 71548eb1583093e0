package authority

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/h2frames"
	"github.com/muster-dev/muster/internal/h2window"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestWhatTheServerSendsPerCall pins what the authority writes to a
// connection for one renewal, read by the client beneath and above TLS:
// over a new connection its SETTINGS, the ack of the client's, and the
// response (HEADERS, DATA, trailers); over a kept connection the response
// alone. No WINDOW_UPDATE or PING of gRPC's window estimation (fixed
// windows: one write and one read less per call), and no frame split
// across TLS records (no dynamic record sizing: a response is one record,
// one write, not a run of small ones). The client keeps fixed windows
// too, dialling as muster's agents do (agent.DialOptions), so it sends
// no PING for the server to answer.
func TestWhatTheServerSendsPerCall(t *testing.T) {
	a := startBench(t)
	ctx := context.Background()
	key, csr := benchCSR(t)
	resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(ctx,
		&musterv1.ExchangeJoinTokenRequest{JoinToken: a.token, NodeId: "wire", Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	chainPEM := resp.GetCertificateChainPem()
	renew := func(conn *grpc.ClientConn) {
		t.Helper()
		k, c := benchCSR(t)
		r, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: c})
		if err != nil {
			t.Fatal(err)
		}
		chainPEM, key = r.GetCertificateChainPem(), k
	}
	dial := func() (*grpc.ClientConn, *wireCreds) {
		t.Helper()
		chain, err := ca.ParseCertsPEM([]byte(chainPEM))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAuthority, a.info.AuthorityID)
		wc := &wireCreds{TransportCredentials: credentials.NewTLS(identity.ClientTLS(
			&identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}, a.h.RootPool(), identity.MatchID(want)))}
		conn, err := grpc.NewClient(*a.srvs[0].advertised.Load(), append(h2window.DialOptions(), grpc.WithTransportCredentials(wc))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn, wc
	}

	t.Run("new connection", func(t *testing.T) {
		conn, wc := dial()
		renew(conn)
		w := wc.only(t)
		got := w.framesSince(0)
		if want := "SETTINGS SETTINGS+ACK HEADERS DATA HEADERS+END_STREAM"; got != want {
			t.Errorf("server frames for a renewal over a new connection: %s, want %s", got, want)
		}
		if err := w.recordsWholeFrames(); err != nil {
			t.Error(err)
		}
	})

	t.Run("kept connection", func(t *testing.T) {
		conn, wc := dial()
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		w := wc.only(t)
		// The health check's answer is read: the connection is quiet.
		from := w.frameCount()
		renew(conn)
		// A second call: any PING the client sent on the renewal's DATA
		// is answered before the server answers the call.
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		if got, want := w.framesSince(from), "HEADERS DATA HEADERS+END_STREAM HEADERS DATA HEADERS+END_STREAM"; got != want {
			t.Errorf("server frames for a renewal, then a health check, over a kept connection: %s, want %s", got, want)
		}
		if err := w.recordsWholeFrames(); err != nil {
			t.Error(err)
		}
	})
}

// wireCreds is a client's TLS credentials that record, per connection,
// the TLS records the server sent (under TLS) and the HTTP/2 frames they
// carried (above it).
type wireCreds struct {
	credentials.TransportCredentials
	mu    sync.Mutex
	wires []*wire
}

func (c *wireCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	w := &wire{}
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, &recordConn{Conn: raw, w: w})
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	c.wires = append(c.wires, w)
	c.mu.Unlock()
	return &h2frames.Conn{Conn: conn, R: &w.frames}, info, nil
}

func (c *wireCreds) Clone() credentials.TransportCredentials {
	return &wireCreds{TransportCredentials: c.TransportCredentials.Clone()}
}

func (c *wireCreds) only(t *testing.T) *wire {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.wires) != 1 {
		t.Fatalf("%d connections, want 1", len(c.wires))
	}
	return c.wires[0]
}

// wire is what the server sent on one connection.
type wire struct {
	mu sync.Mutex
	// records: each TLS record's type and length, from the start.
	records []tlsRecord
	rhead   []byte // a record header read in part
	rleft   int    // bytes of the current record's body still to come
	// frames: each HTTP/2 frame the server sent, above TLS.
	frames h2frames.Reader
}

type tlsRecord struct {
	typ byte
	len int
}

func (w *wire) readRaw(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(b) > 0 {
		if w.rleft > 0 {
			n := min(w.rleft, len(b))
			w.rleft -= n
			b = b[n:]
			continue
		}
		n := min(5-len(w.rhead), len(b))
		w.rhead = append(w.rhead, b[:n]...)
		b = b[n:]
		if len(w.rhead) == 5 {
			r := tlsRecord{typ: w.rhead[0], len: int(binary.BigEndian.Uint16(w.rhead[3:]))}
			w.records = append(w.records, r)
			w.rleft, w.rhead = r.len, w.rhead[:0]
		}
	}
}

func (w *wire) frameCount() int { return w.frames.Count() }

// framesSince names the frames from the from-th on: type, and the ACK
// and END_STREAM flags where they are set.
func (w *wire) framesSince(from int) string { return w.frames.Names(from) }

// recordsWholeFrames says which of the server's records after its
// handshake, if any, ends inside an HTTP/2 frame. Those records are the
// last ones, whose plaintext (a TLS 1.3 record's body less its content
// type byte and 16-byte tag) adds up to the plaintext read; the
// connection must be quiet, nothing read in part.
func (w *wire) recordsWholeFrames() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	plain, partial := w.frames.Read()
	if w.rleft != 0 || len(w.rhead) != 0 || partial {
		return fmt.Errorf("a record or frame read in part")
	}
	ends := map[int]bool{}
	for _, f := range w.frames.Frames(0) {
		ends[f.End] = true
	}
	var app []int
	sum := 0
	for i := len(w.records) - 1; i >= 0 && sum < plain; i-- {
		r := w.records[i]
		if r.typ != 23 {
			return fmt.Errorf("record of type %d after the handshake", r.typ)
		}
		app = append(app, r.len-17)
		sum += r.len - 17
	}
	if sum != plain {
		return fmt.Errorf("the last records hold %d bytes of plaintext, %d read", sum, plain)
	}
	slices.Reverse(app)
	at := 0
	for i, n := range app {
		at += n
		if !ends[at] {
			return fmt.Errorf("record %d of the %d after the handshake (%d bytes; sizes %v) ends inside a frame", i+1, len(app), n, app)
		}
	}
	return nil
}

type recordConn struct {
	net.Conn
	w *wire
}

func (c *recordConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.w.readRaw(b[:n])
	return n, err
}
