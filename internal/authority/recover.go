package authority

import (
	"context"
	"fmt"
	"runtime/debug"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A panic in a request's handler is a bug in muster, but a replica that
// exits on it takes every agent's stream and every other caller's request
// with it, and whoever can send the request can send it again: the
// call is answered INTERNAL, with its correlation ID, and the panic is
// logged with its stack for the operator to report: by the unary
// authorization interceptor, inside which the metrics interceptor counts
// the answer; for streams by the stream interceptor's authorization, the
// join stream's handler, and the agent stream's (agentStream.finish) and
// its receive loop.

// panicked is a panic carried from the goroutine it happened on (apart,
// the stream's receive loop) to the handler's, with the stack where it
// happened.
type panicked struct {
	value any
	stack []byte
}

func (p panicked) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// panicEnd ends an agent stream whose receive loop panicked: the call's
// answer, the panic logged already.
type panicEnd struct{ status error }

func (e panicEnd) Error() string { return e.status.Error() }

// catch is deferred on a goroutine a request runs on: a panic becomes a
// panicked in *to.
func catch(to *error) {
	if r := recover(); r != nil {
		if p, ok := r.(panicked); ok {
			*to = p
			return
		}
		*to = panicked{value: r, stack: debug.Stack()}
	}
}

// recovered is deferred around a stream's authorization (streamAuth) and
// the join stream: a panic becomes the call's INTERNAL answer in *err.
func (s *Server) recovered(ctx context.Context, method string, err *error) {
	if r := recover(); r != nil {
		*err = s.panicAnswer(ctx, method, r)
	}
}

// panicAnswer logs r, a recovered panic, with the stack where it happened,
// and returns the call's answer.
func (s *Server) panicAnswer(ctx context.Context, method string, r any) error {
	p, ok := r.(panicked)
	if !ok {
		p = panicked{value: r, stack: debug.Stack()}
	}
	c := callerFrom(ctx)
	s.log.Error("request handler panicked; the call was answered INTERNAL", "method", method, "caller", c.Actor(),
		"correlation_id", c.CorrelationID, "panic", fmt.Sprint(p.value), "stack", string(p.stack))
	return status.Errorf(codes.Internal, "internal error (correlation id %s)", c.CorrelationID)
}
