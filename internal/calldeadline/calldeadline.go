// Package calldeadline bounds a gRPC server's calls in time from the
// moment their headers arrive. gRPC reads a unary request whole before any
// interceptor or handler runs, so a deadline set there is too late for a
// call whose request never comes: it held its place among the
// connection's streams, and kept the connection from being idle, for good.
// A tap handle runs as the headers arrive, before that read.
package calldeadline

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/tap"
)

// errTimedOut is the cause of a call's context ended by Tap's deadline,
// which tells it from the caller's own deadline or cancellation.
var errTimedOut = errors.New("the call lasted longer than the call timeout")

// Tap returns a handle for grpc.InTapHandle that gives each call whose
// method bounded reports a deadline of d, where its caller gave none or a
// later one, and calls timedOut(ctx, method) when a call ends at that
// deadline (not when it ends sooner or by the caller's own).
func Tap(d time.Duration, bounded func(method string) bool, timedOut func(ctx context.Context, method string)) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if !bounded(info.FullMethodName) {
			return ctx, nil
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
			return ctx, nil
		}
		// Released with the stream: gRPC cancels the parent when it ends.
		ctx, cancel := context.WithTimeoutCause(ctx, d, errTimedOut)
		context.AfterFunc(ctx, func() {
			defer cancel()
			if context.Cause(ctx) == errTimedOut {
				timedOut(ctx, info.FullMethodName)
			}
		})
		return ctx, nil
	}
}
