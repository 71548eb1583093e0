// Package httpserve runs a plain HTTP server on a listener for as long as
// a context lasts: the one way muster's side listeners (the agent's
// metrics and probes, pprof) start and stop.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Serve serves h on lis until ctx ends, then shuts down, giving requests
// in flight five seconds. It sets a header read timeout and no write
// timeout (a CPU profile streams for as long as its caller asks).
func Serve(ctx context.Context, lis net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
