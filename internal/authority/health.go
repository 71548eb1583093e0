package authority

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/callinfo"
)

// maxHealthWatches bounds the grpc.health.v1.Health/Watch streams a
// listener holds at once; healthWatchFor is how long one lasts. Watch is
// anonymous, and a connection carrying a call is never idle, so without
// them a Watch held its connection past the idle close for good. Past the
// bound a Watch is refused RESOURCE_EXHAUSTED (Check answers as ever); at
// its end the client watches again, or its connection goes idle and is
// closed like any other.
const maxHealthWatches = 64

// One source holds at most callcap.HealthWatches of them, on the api and
// bootstrap listeners together, so that it cannot hold all
// maxHealthWatches for healthWatchFor at a time and shut every other
// health checker out: counted with its other calls, in limits.max_calls_per_source's
// map, and refused there (callTap).

// healthWatchFor is a variable so tests can shorten it.
var healthWatchFor = idleTimeout

// refusalRecorder audits a refusal through the flood guard
// (audit.Refusals).
type refusalRecorder interface {
	Record(ctx context.Context, e audit.Event)
}

// boundedHealth is the health service with Watch bounded.
type boundedHealth struct {
	*health.Server
	refusals refusalRecorder

	mu   sync.Mutex
	held int
}

func newBoundedHealth(hs *health.Server, refusals refusalRecorder) *boundedHealth {
	return &boundedHealth{Server: hs, refusals: refusals}
}

func (h *boundedHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	src := ""
	if a := callinfo.Source(stream.Context()); a.IsValid() {
		src = a.String()
	}
	if err := h.take(stream.Context(), src); err != nil {
		return err
	}
	defer h.release()
	ctx, cancel := context.WithTimeout(stream.Context(), healthWatchFor)
	defer cancel()
	err := h.Server.Watch(req, watchStream{Health_WatchServer: stream, ctx: ctx})
	if ctx.Err() != nil && stream.Context().Err() == nil {
		return status.Errorf(codes.DeadlineExceeded, "a health watch lasts at most %s; watch again", healthWatchFor)
	}
	return err
}

// take counts a watch, unless the listener holds maxHealthWatches
// already: then the watch is refused RESOURCE_EXHAUSTED and audited.
func (h *boundedHealth) take(ctx context.Context, src string) error {
	h.mu.Lock()
	if h.held < maxHealthWatches {
		h.held++
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	if h.refusals != nil {
		c := callerFrom(ctx)
		h.refusals.Record(ctx, audit.Event{Actor: c.Actor(), Action: "api.access", Target: healthpb.Health_Watch_FullMethodName,
			Result: audit.ResultDenied, Source: src, CorrelationID: c.CorrelationID,
			Reason: fmt.Sprintf("health watch refused: this listener holds %d watches already, the most it may hold (each lasts up to %s); "+
				"health checkers should poll grpc.health.v1.Health/Check", maxHealthWatches, healthWatchFor)})
	}
	return status.Errorf(codes.ResourceExhausted, "this listener holds %d health watches already; use Check", maxHealthWatches)
}

// release gives a watch's place back.
func (h *boundedHealth) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held--
}

// watchStream is a Watch's stream with the bounded context.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }
