package authority

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/store"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

//go:noinline
func panicHere() { panic("boom") }

// stubStream is an agent stream with a context; Recv panics.
type stubStream struct {
	musterv1.AgentService_ConnectServer
	ctx context.Context
}

func (s stubStream) Context() context.Context            { return s.ctx }
func (stubStream) Recv() (*musterv1.AgentMessage, error) { panicHere(); return nil, nil }

// A panic in a handler, or on a goroutine it runs work on, is answered
// INTERNAL for that call and logged once with the stack where it
// happened — the process goes on. Each case runs the code that recovers
// it in the authority: the unary interceptor, the stream interceptor's
// authorization, the agent stream's handler and receive loop.
func TestPanicIsAnsweredInternal(t *testing.T) {
	// The real authority logs into shared, which its own goroutines (the
	// leader's jobs) write to as well: swapping its logger mid-run raced
	// with them. Its cases read only the lines written during their call
	// that are about a panic.
	var shared lockedBuffer
	b := startReplicas(t, nil, 1, func(c *Config) { c.Log = slog.New(slog.NewTextHandler(&shared, nil)) })
	const method = "/muster.v1.BootstrapService/GetTrustBundle" // public: authorized without a certificate
	unary := func(s *Server, ctx context.Context, h func()) error {
		_, err := s.unaryAuth(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method},
			func(context.Context, any) (any, error) { h(); return nil, nil }, false)
		return err
	}
	for _, tt := range []struct {
		name, method, where string
		call                func(s *Server, ctx context.Context) error
	}{
		{"in a unary handler", method, "panicHere", func(s *Server, ctx context.Context) error {
			return unary(s, ctx, panicHere)
		}},
		{"apart, in a unary handler", method, "panicHere", func(s *Server, ctx context.Context) error {
			return unary(s, ctx, func() { apart(panicHere) })
		}},
		{"apart within apart", method, "panicHere", func(s *Server, ctx context.Context) error {
			return unary(s, ctx, func() { apart(func() { apart(panicHere) }) })
		}},
		// The server has no change hub: opening the stream panics, apart.
		{"opening an agent stream", musterv1.AgentService_Connect_FullMethodName, "subscribe", func(s *Server, ctx context.Context) error {
			return (&agentService{s: s}).Connect(stubStream{ctx: ctx})
		}},
		{"in an agent stream's receive loop", musterv1.AgentService_Connect_FullMethodName, "panicHere", func(s *Server, ctx context.Context) (err error) {
			st := &agentStream{a: &agentService{s: s}, stream: stubStream{ctx: ctx}, recvErr: make(chan error, 1)}
			defer st.finish(&err)
			go st.receive()
			return st.closedByAgent(<-st.recvErr)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			s := &Server{log: slog.New(slog.NewTextHandler(&buf, nil))}
			read := func() string { return buf.String() }
			if strings.HasPrefix(tt.method, "/muster.v1.Bootstrap") {
				// The real authority's authorization, logging to shared.
				s = b.srvs[0]
				from := shared.Len()
				read = func() string {
					var out []string
					for _, l := range strings.Split(shared.String()[from:], "\n") {
						if strings.Contains(l, "panic") {
							out = append(out, l)
						}
					}
					return strings.Join(out, "\n")
				}
			}
			ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-9"})
			err := tt.call(s, ctx)
			if status.Code(err) != codes.Internal {
				t.Fatalf("answered %v, want INTERNAL", err)
			}
			logged := read()
			lines := strings.Split(strings.TrimSpace(logged), "\n")
			if len(lines) != 1 {
				t.Fatalf("logged %d lines, want 1:\n%s", len(lines), logged)
			}
			for _, want := range []string{"method=" + tt.method, "request handler panicked", tt.where} {
				if !strings.Contains(lines[0], want) {
					t.Errorf("the log line does not say %s:\n%s", want, lines[0])
				}
			}
			// The answer names the correlation ID the log line carries.
			if id := lineValue(lines[0], "correlation_id"); id == "" || !strings.Contains(err.Error(), id) {
				t.Errorf("answered %v; the log line's correlation ID is %q", err, id)
			}
		})
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lineValue is the value of key in a slog text line.
func lineValue(line, key string) string {
	_, rest, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, " ")
	return strings.Trim(v, `"`)
}

// A panic recording an open stream's end is answered, and what the stream
// held is released all the same: its subscription, its context, the gauge.
func TestPanicEndingAStreamReleasesIt(t *testing.T) {
	var buf bytes.Buffer
	m, err := newStreamMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{log: slog.New(slog.NewTextHandler(&buf, nil)), hub: newStreamHub(), streams: m, store: panickingClock{}}
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-9"})
	st := &agentStream{a: &agentService{s: s}, stream: stubStream{ctx: ctx}, opened: true}
	st.wake, st.unsub = s.hub.subscribe("n1")
	st.ctx, st.cancel = context.WithCancel(ctx)
	m.connected.Inc()
	err = func() (err error) {
		defer st.finish(&err)
		return nil
	}()
	if status.Code(err) != codes.Internal {
		t.Fatalf("answered %v, want INTERNAL", err)
	}
	if st.ctx.Err() == nil {
		t.Error("the stream's context was not cancelled")
	}
	if n := len(s.hub.byNode["n1"]); n != 0 {
		t.Errorf("%d subscriptions left", n)
	}
	var g dto.Metric
	if err := m.connected.Write(&g); err != nil || g.GetGauge().GetValue() != 0 {
		t.Errorf("muster_connected_agents = %v (%v), want 0", g.GetGauge().GetValue(), err)
	}
	if !strings.Contains(buf.String(), "recordEnd") {
		t.Errorf("the panic logged is not the end's record:\n%s", buf.String())
	}
}

// panickingClock is a store whose clock panics.
type panickingClock struct{ store.Store }

func (panickingClock) Now(context.Context) (time.Time, error) { panic("clock") }

// A stream whose opening panics after it subscribed to changes leaves no
// subscription behind.
func TestPanicOpeningAStreamLeavesNothingOpen(t *testing.T) {
	var buf bytes.Buffer
	// A caller without a certificate: the opening panics after the
	// subscription.
	s := &Server{log: slog.New(slog.NewTextHandler(&buf, nil)), hub: newStreamHub()}
	ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-9"})
	err := (&agentService{s: s}).Connect(stubStream{ctx: ctx})
	if status.Code(err) != codes.Internal {
		t.Fatalf("answered %v, want INTERNAL", err)
	}
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	for node, ws := range s.hub.byNode {
		if len(ws) > 0 {
			t.Errorf("node %q still has %d subscriptions", node, len(ws))
		}
	}
	if !strings.Contains(buf.String(), "(*agentStream).open") {
		t.Errorf("the panic logged is not the opening's:\n%s", buf.String())
	}
}
