package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestCallsEndAtCallTimeout: a call whose request never comes, with no
// deadline or a later one than limits.call_timeout, and a reflection
// stream left open, end DEADLINE_EXCEEDED at the call timeout, and the
// refusal is audited with its reason; a health watch (which bounds itself)
// is not cut. Before, each held its place among the connection's 100
// calls, and kept the connection from ever being idle, for good.
func TestCallsEndAtCallTimeout(t *testing.T) {
	const limit = 300 * time.Millisecond
	a := startReplicas(t, nil, 1, func(c *Config) { c.CallTimeout = limit })
	const wait = 10 * time.Second
	unary := "/" + musterv1.BootstrapService_ServiceDesc.ServiceName + "/" + musterv1.BootstrapService_ServiceDesc.Methods[0].MethodName

	for _, callerDeadline := range []time.Duration{0, time.Hour} {
		ctx, cancel := context.WithCancel(t.Context())
		if callerDeadline > 0 {
			ctx, cancel = context.WithTimeout(t.Context(), callerDeadline)
		}
		// The headers go out at once; the request never does.
		cs, err := a.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, unary)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { got <- cs.RecvMsg(&emptypb.Empty{}) }()
		select {
		case err := <-got:
			if status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("a request never sent (caller's deadline %s): %v, want DEADLINE_EXCEEDED", callerDeadline, err)
			}
		case <-time.After(wait):
			t.Errorf("a request never sent (caller's deadline %s) was still waited for after %s", callerDeadline, wait)
		}
		cancel()
	}

	// Reflection answers for as long as it is asked.
	rs, err := reflectionpb.NewServerReflectionClient(a.conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Recv(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := rs.Recv(); got <- err }()
	select {
	case err := <-got:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("a reflection stream left open: %v, want DEADLINE_EXCEEDED", err)
		}
	case <-time.After(wait):
		t.Errorf("a reflection stream was still open after %s", wait)
	}

	// A health watch bounds itself (healthWatchFor), so it outlives the
	// call timeout.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := healthpb.NewHealthClient(a.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	watchEnd := make(chan error, 1)
	go func() { _, err := w.Recv(); watchEnd <- err }()
	select {
	case err := <-watchEnd:
		t.Errorf("a health watch ended at the call timeout: %v", err)
	case <-time.After(4 * limit):
	}

	var found int
	deadline := time.Now().Add(wait)
	for found < 3 && time.Now().Before(deadline) {
		recs, err := a.store.ListAudit(t.Context(), store.AuditFilter{Action: "api.access"})
		if err != nil {
			t.Fatal(err)
		}
		found = 0
		for _, r := range recs {
			if strings.Contains(r.Reason, "limits.call_timeout") && r.Result == "denied" && r.Source != "" {
				found++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if found < 3 {
		t.Errorf("%d refusals audited naming limits.call_timeout, want 3", found)
	}
}
