package authority

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// maxHealthWatches bounds the grpc.health.v1.Health/Watch streams a
// listener holds at once; healthWatchFor is how long one lasts. Watch is
// anonymous, and a connection carrying a call is never idle, so without
// them a Watch held its connection past the idle close for good. Past the
// bound a Watch is refused RESOURCE_EXHAUSTED (Check answers as ever); at
// its end the client watches again, or its connection goes idle and is
// closed like any other.
const maxHealthWatches = 64

// healthWatchFor is a variable so tests can shorten it.
var healthWatchFor = idleTimeout

// boundedHealth is the health service with Watch bounded.
type boundedHealth struct {
	*health.Server
	slots chan struct{}
}

func newBoundedHealth(hs *health.Server) *boundedHealth {
	return &boundedHealth{Server: hs, slots: make(chan struct{}, maxHealthWatches)}
}

func (h *boundedHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	select {
	case h.slots <- struct{}{}:
	default:
		return status.Errorf(codes.ResourceExhausted, "this listener holds %d health watches already; use Check", maxHealthWatches)
	}
	defer func() { <-h.slots }()
	ctx, cancel := context.WithTimeout(stream.Context(), healthWatchFor)
	defer cancel()
	err := h.Server.Watch(req, watchStream{Health_WatchServer: stream, ctx: ctx})
	if ctx.Err() != nil && stream.Context().Err() == nil {
		return status.Errorf(codes.DeadlineExceeded, "a health watch lasts at most %s; watch again", healthWatchFor)
	}
	return err
}

// watchStream is a Watch's stream with the bounded context.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }
