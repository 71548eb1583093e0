package discoveryd

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/muster-dev/muster/internal/callcap"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestCallsPerSourceCapped: with Config.MaxCallsPerSource 3, three calls
// whose request never comes hold the source's places; the next gRPC call
// is refused RESOURCE_EXHAUSTED naming the setting, an HTTPS request 429,
// both audited with their source; a call that ends gives its place back.
// Before, one source could hold 100 calls on each of its 256 connections
// for the call timeout.
func TestCallsPerSourceCapped(t *testing.T) {
	const limit = 3
	e := start(t, func(s *Server) { s.calls = callcap.New(limit); s.callTimeout = time.Hour })
	const wait = 10 * time.Second
	unary := "/" + musterv1.DiscoveryService_ServiceDesc.ServiceName + "/" + musterv1.DiscoveryService_ServiceDesc.Methods[0].MethodName
	var ends []context.CancelFunc
	defer func() {
		for _, end := range ends {
			end()
		}
	}()
	// held are the calls opened and not ended. One may be refused as it
	// starts: a call the cap counted and the client then gave up (gRPC
	// retries a stream that HTTP/2 refused at its start, and the cap
	// counted it while its handler ran) can hold a place for a moment.
	// That call ends, and another is opened in its place.
	type heldCall struct {
		end   context.CancelFunc
		ended chan struct{}
	}
	var held []heldCall
	live := func() (n int) {
		for _, h := range held {
			select {
			case <-h.ended:
			default:
				n++
			}
		}
		return n
	}
	hold := func() {
		ctx, cancel := context.WithCancel(t.Context())
		ends = append(ends, cancel)
		cs, err := e.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, unary)
		if err != nil {
			t.Fatal(err)
		}
		h := heldCall{end: cancel, ended: make(chan struct{})}
		held = append(held, h)
		go func() {
			cs.RecvMsg(&emptypb.Empty{})
			close(h.ended)
		}()
	}
	health := healthpb.NewHealthClient(e.conn)
	var err error
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for live() < limit {
			hold()
		}
		if _, err = health.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
			break
		}
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "raise discovery's limits.max_calls_per_source") {
		t.Fatalf("a call past the source's %d in flight: %v, want RESOURCE_EXHAUSTED naming limits.max_calls_per_source", limit, err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + e.addr + discoveryclient.JWKSPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("an HTTPS request past the source's cap: %s, want 429", resp.Status)
	}

	for _, h := range held {
		select {
		case <-h.ended:
			continue
		default:
		}
		h.end()
		break
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		if _, err = health.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Errorf("a call after one of the held calls ended: %v", err)
	}

	var grpcRefused, httpsRefused bool
	for deadline := time.Now().Add(wait); !(grpcRefused && httpsRefused) && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		recs, err := e.st.ListAudit(t.Context(), store.AuditFilter{Action: "api.access"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Result != "denied" || r.Source != "127.0.0.1" || !strings.Contains(r.Reason, "3 calls from 127.0.0.1 have not ended") {
				continue
			}
			grpcRefused = grpcRefused || r.Target == healthpb.Health_Check_FullMethodName
			httpsRefused = httpsRefused || r.Target == discoveryclient.JWKSPath
		}
	}
	if !grpcRefused || !httpsRefused {
		t.Errorf("refusals audited with source and reason: gRPC %v, HTTPS %v; want both", grpcRefused, httpsRefused)
	}
}

func TestGRPCMessage(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"plain words, (1024) and: punctuation", "plain words, (1024) and: punctuation"},
		{"100%", "100%25"},
		{"line\nbreak", "line%0Abreak"},
		{"é", "%C3%A9"},
	} {
		if got := grpcMessage(tt.in); got != tt.want {
			t.Errorf("grpcMessage(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestHealthWatchesPerSource: one source holds at most
// callcap.HealthWatches grpc.health.v1.Health/Watch streams at once, as on
// the authority; the next is refused RESOURCE_EXHAUSTED and audited with
// its source and why, while the source's other calls go on, and a watch
// that ends gives its place back. Before, discovery served the plain
// health server: one source held up to its call cap of watches, each
// until the call timeout.
func TestHealthWatchesPerSource(t *testing.T) {
	e := start(t, func(s *Server) { s.callTimeout = time.Hour })
	const wait = 10 * time.Second
	health := healthpb.NewHealthClient(e.conn)
	var ends []context.CancelFunc
	defer func() {
		for _, end := range ends {
			end()
		}
	}()
	watch := func() error {
		ctx, cancel := context.WithCancel(t.Context())
		ends = append(ends, cancel)
		w, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv() // the first status: the watch is held
		}
		return err
	}
	for i := range callcap.HealthWatches.PerSource {
		if err := watch(); err != nil {
			t.Fatalf("watch %d: %v", i+1, err)
		}
	}
	err := watch()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "health watch refused") {
		t.Fatalf("watch %d of one source: %v, want RESOURCE_EXHAUSTED", callcap.HealthWatches.PerSource+1, err)
	}
	if _, err := health.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a Check of the source holding its watches: %v", err)
	}
	ends[0]()
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		if err = watch(); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Errorf("a watch after one of the held watches ended: %v", err)
	}

	var audited bool
	for deadline := time.Now().Add(wait); !audited && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		recs, err := e.st.ListAudit(t.Context(), store.AuditFilter{Action: "api.access"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			audited = audited || r.Result == "denied" && r.Source == "127.0.0.1" && r.Target == healthpb.Health_Watch_FullMethodName &&
				strings.Contains(r.Reason, "the most one source may hold") && strings.Contains(r.Reason, "trusted_proxies: in discovery.yaml")
		}
	}
	if !audited {
		t.Error("the refused watch is not audited with its source and why")
	}
}
