// Package httpserve builds and runs muster's plain HTTP servers (the
// authority's and discovery's metrics and CRL listeners, the agent's
// metrics and probes, pprof), so that every one holds a connection only
// for a bounded time: a client that sends its headers or body slowly,
// stops reading the answer, or keeps an idle connection open is closed.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Timeouts are what a server's connections may hold it for. Zero leaves
// one unbounded.
type Timeouts struct {
	// ReadHeader bounds the request line and headers (and, before them,
	// a TLS handshake).
	ReadHeader time.Duration
	// Read bounds the whole request, its body included. net/http also
	// cancels a handler's context when it passes, so a server whose
	// answer streams for long (pprof) leaves it zero.
	Read time.Duration
	// Write bounds the answer, from the end of the request's headers.
	Write time.Duration
	// Idle closes a kept-alive connection that sends no next request.
	// Without it a connection sent one request and then held its place
	// (of the listener's few: listener.MetricsMaxConns) for good.
	Idle time.Duration
}

// Default is what a server of short answers (metrics, probes, CRLs)
// allows.
var Default = Timeouts{ReadHeader: 10 * time.Second, Read: 30 * time.Second, Write: 30 * time.Second, Idle: 2 * time.Minute}

// Streaming is Default for a server whose answer lasts as long as its
// caller asks (a CPU profile or a trace): neither the whole request nor
// the answer is bounded.
var Streaming = Timeouts{ReadHeader: Default.ReadHeader, Idle: Default.Idle}

// MaxHeaderBytes bounds a request's headers; the requests these servers
// take are a GET with a few headers.
const MaxHeaderBytes = 16 << 10

// NewServer is an HTTP server of h with the timeouts t and MaxHeaderBytes.
func NewServer(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write,
		IdleTimeout: t.Idle, MaxHeaderBytes: MaxHeaderBytes}
}

// Serve serves srv on lis until ctx ends, then shuts down, giving requests
// in flight five seconds.
func Serve(ctx context.Context, lis net.Listener, srv *http.Server) error {
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
