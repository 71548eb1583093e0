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

// maxHealthWatchesPerSource bounds the watches one source holds on a
// listener at once, so that one source cannot hold all maxHealthWatches
// for healthWatchFor at a time and shut every other health checker out.
// A source is the call's source address (callinfo.Source): the TCP peer,
// or the client a trusted proxy's PROXY header names, as the listener's
// per-source connection cap counts it. A health checker watches a service
// or two; 8 leave room for several behind one address.
const maxHealthWatchesPerSource = 8

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

	mu       sync.Mutex
	held     int
	bySource map[string]int
}

func newBoundedHealth(hs *health.Server, refusals refusalRecorder) *boundedHealth {
	return &boundedHealth{Server: hs, refusals: refusals, bySource: map[string]int{}}
}

func (h *boundedHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	src := ""
	if a := callinfo.Source(stream.Context()); a.IsValid() {
		src = a.String()
	}
	if err := h.take(stream.Context(), src); err != nil {
		return err
	}
	defer h.release(src)
	ctx, cancel := context.WithTimeout(stream.Context(), healthWatchFor)
	defer cancel()
	err := h.Server.Watch(req, watchStream{Health_WatchServer: stream, ctx: ctx})
	if ctx.Err() != nil && stream.Context().Err() == nil {
		return status.Errorf(codes.DeadlineExceeded, "a health watch lasts at most %s; watch again", healthWatchFor)
	}
	return err
}

// take counts a watch of src, unless the listener or src holds its bound
// already: then the watch is refused RESOURCE_EXHAUSTED and audited.
func (h *boundedHealth) take(ctx context.Context, src string) error {
	h.mu.Lock()
	var answer, reason string
	switch {
	case h.bySource[src] >= maxHealthWatchesPerSource:
		answer = fmt.Sprintf("this source holds %d health watches on this listener already, the most one source may; end one, or use Check", maxHealthWatchesPerSource)
		reason = fmt.Sprintf("health watch refused: this source holds %d watches on this listener already, the most one source may hold "+
			"(each lasts up to %s); a health checker there should poll grpc.health.v1.Health/Check or watch fewer services, "+
			"and if it is a load balancer's address, name the balancer with --trusted-proxy IP|CIDR (trusted_proxies: in authority.yaml) and have it send the PROXY header, so each client counts as itself",
			maxHealthWatchesPerSource, healthWatchFor)
	case h.held >= maxHealthWatches:
		answer = fmt.Sprintf("this listener holds %d health watches already; use Check", maxHealthWatches)
		reason = fmt.Sprintf("health watch refused: this listener holds %d watches already, the most it may hold (each lasts up to %s); "+
			"health checkers should poll grpc.health.v1.Health/Check", maxHealthWatches, healthWatchFor)
	default:
		h.held++
		h.bySource[src]++
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	if h.refusals != nil {
		c := callerFrom(ctx)
		h.refusals.Record(ctx, audit.Event{Actor: c.Actor(), Action: "api.access", Target: healthpb.Health_Watch_FullMethodName,
			Result: audit.ResultDenied, Reason: reason, Source: src, CorrelationID: c.CorrelationID})
	}
	return status.Error(codes.ResourceExhausted, answer)
}

// release gives src's watch back.
func (h *boundedHealth) release(src string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held--
	if h.bySource[src]--; h.bySource[src] <= 0 {
		delete(h.bySource, src)
	}
}

// watchStream is a Watch's stream with the bounded context.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }
