package discoveryd

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestCallsEndAtCallTimeout: a call whose request never comes ends
// DEADLINE_EXCEEDED at the call timeout, and a health watch left open
// ends too (CANCELLED, gRPC's health service's word for it), both
// refusals audited; the connection still serves calls after it. Before,
// each held a stream of the connection, and the connection (never idle
// while it carries a call), for good.
func TestCallsEndAtCallTimeout(t *testing.T) {
	const limit = 300 * time.Millisecond
	e := start(t, func(s *Server) { s.callTimeout = limit })
	const wait = 10 * time.Second
	unary := "/" + musterv1.DiscoveryService_ServiceDesc.ServiceName + "/" + musterv1.DiscoveryService_ServiceDesc.Methods[0].MethodName

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cs, err := e.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, unary)
	if err != nil {
		t.Fatal(err)
	}
	unaryEnd, watchEnd := make(chan error, 1), make(chan error, 1)
	go func() { unaryEnd <- cs.RecvMsg(&emptypb.Empty{}) }()
	w, err := healthpb.NewHealthClient(e.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	go func() { _, err := w.Recv(); watchEnd <- err }()
	for _, c := range []struct {
		what string
		end  chan error
		want []codes.Code
	}{
		{"a request never sent", unaryEnd, []codes.Code{codes.DeadlineExceeded}},
		{"a health watch", watchEnd, []codes.Code{codes.DeadlineExceeded, codes.Canceled}},
	} {
		select {
		case err := <-c.end:
			if !slices.Contains(c.want, status.Code(err)) {
				t.Errorf("%s: %v, want %v", c.what, err, c.want)
			}
		case <-time.After(wait):
			t.Fatalf("%s was still open after %s", c.what, wait)
		}
	}
	if _, err := healthpb.NewHealthClient(e.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a call on the same connection after the call timeout: %v", err)
	}

	var found int
	deadline := time.Now().Add(wait)
	for found < 2 && time.Now().Before(deadline) {
		recs, err := e.st.ListAudit(t.Context(), store.AuditFilter{Action: "api.access"})
		if err != nil {
			t.Fatal(err)
		}
		found = 0
		for _, r := range recs {
			if strings.Contains(r.Reason, "call timeout") && r.Source == "127.0.0.1" {
				found++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if found < 2 {
		t.Errorf("%d refusals audited naming the call timeout, want 2", found)
	}
}

// TestStreamsPerConnectionCapped: discovery advertises, and holds to, 100
// calls at once per connection: the 101st open call is reset (a client
// that read the advertised setting never sends it). Before, net/http's default let each connection carry
// 250, each a handler and its goroutines.
func TestStreamsPerConnectionCapped(t *testing.T) {
	e := start(t)
	conn, err := tls.Dial("tcp", e.addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	path := "/" + musterv1.DiscoveryService_ServiceDesc.ServiceName + "/" + musterv1.DiscoveryService_ServiceDesc.Methods[0].MethodName
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: e.addr}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		enc.WriteField(f)
	}
	advertised := uint32(0)
	for advertised == 0 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			v, _ := sf.Value(http2.SettingMaxConcurrentStreams)
			advertised = v
			fr.WriteSettingsAck()
			if v == 0 {
				t.Fatal("no SETTINGS_MAX_CONCURRENT_STREAMS advertised")
			}
		}
	}
	if advertised != MaxStreamsPerConn {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", advertised, MaxStreamsPerConn)
	}
	// Open calls, their requests never sent, one past the cap.
	last := uint32(2*MaxStreamsPerConn + 1)
	for id := uint32(1); id <= last; id += 2 {
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no reset of call %d past the cap: %v", MaxStreamsPerConn+1, err)
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok {
			if rst.StreamID != last {
				t.Fatalf("stream %d reset (%v), want only %d, the call past the cap", rst.StreamID, rst.ErrCode, last)
			}
			return
		}
	}
}
