package authority

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
// happened — the process goes on.
func TestPanicIsAnsweredInternal(t *testing.T) {
	const method = "/muster.v1.AdminService/SendTask"
	// recover answers a panic of call as the unary interceptor does.
	recover := func(s *Server, ctx context.Context, call func()) (err error) {
		defer s.recovered(ctx, method, &err)
		call()
		return nil
	}
	for _, tt := range []struct {
		name, method, where string
		call                func(s *Server, ctx context.Context) error
	}{
		{"in a unary handler", method, "panicHere", func(s *Server, ctx context.Context) error {
			return recover(s, ctx, panicHere)
		}},
		{"apart", method, "panicHere", func(s *Server, ctx context.Context) error {
			return recover(s, ctx, func() { apart(panicHere) })
		}},
		{"apart within apart", method, "panicHere", func(s *Server, ctx context.Context) error {
			return recover(s, ctx, func() { apart(func() { apart(panicHere) }) })
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
			ctx := context.WithValue(t.Context(), callerKey{}, Caller{CorrelationID: "corr-9"})
			err := tt.call(s, ctx)
			if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "corr-9") {
				t.Fatalf("answered %v, want INTERNAL naming the correlation ID", err)
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if len(lines) != 1 {
				t.Fatalf("logged %d lines, want 1:\n%s", len(lines), buf.String())
			}
			for _, want := range []string{"method=" + tt.method, "correlation_id=corr-9", tt.where} {
				if !strings.Contains(lines[0], want) {
					t.Errorf("the log line does not say %s:\n%s", want, lines[0])
				}
			}
		})
	}
}

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
