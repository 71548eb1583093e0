// Package pprofserve serves Go's runtime profiles (net/http/pprof) for a
// muster process, only on a loopback address and only when an operator
// asks for it with --pprof-listen: profiles expose memory contents (heap
// dumps), goroutine stacks and command lines, so they never share the
// metrics listener, which is often reachable from a scraper's network.
package pprofserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"

	"github.com/muster-dev/muster/internal/httpserve"
)

// ErrNotLoopback refuses an address that other machines could reach.
var ErrNotLoopback = errors.New("pprof listens only on a loopback address (127.0.0.1, [::1] or localhost)")

// CheckAddr accepts HOST:PORT whose host is a loopback IP literal or
// "localhost"; an empty host (all interfaces) and any other name are
// refused, since a name may resolve to anything.
func CheckAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("pprof address %q: want HOST:PORT", addr)
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("pprof address %q: %w", addr, ErrNotLoopback)
	}
	return nil
}

// Listen checks addr with CheckAddr, listens, and checks the address it
// got is loopback too (for "localhost", which a hosts file could map
// elsewhere).
func Listen(addr string) (net.Listener, error) {
	if err := CheckAddr(addr); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof: cannot listen on %s: %w", addr, err)
	}
	if ap, err := netip.ParseAddrPort(lis.Addr().String()); err != nil || !ap.Addr().Unmap().IsLoopback() {
		lis.Close()
		return nil, fmt.Errorf("pprof address %q resolved to %s: %w", addr, lis.Addr(), ErrNotLoopback)
	}
	return lis, nil
}

// Handler serves the profiles under /debug/pprof/.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Serve serves Handler on lis until ctx ends.
func Serve(ctx context.Context, lis net.Listener) error {
	// Streaming: a CPU profile or trace streams for as long as the
	// caller's ?seconds= asks, so neither the request nor the answer is
	// bounded; an idle connection still is.
	return httpserve.Serve(ctx, lis, httpserve.NewServer(Handler(), httpserve.Streaming))
}
