package discoveryd

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/audit"
)

// sourceOf is a request's source address: the TCP peer, or the client a
// trusted proxy named (the listener gives it as the connection's remote
// address); the zero Addr if it has none.
func sourceOf(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// refuseHeld answers a call past its source's Config.MaxCallsPerSource,
// before its request is read: RESOURCE_EXHAUSTED in a gRPC trailers-only
// answer, or 429 to an HTTPS request. The refusal is audited through the
// flood guard.
func (s *Server) refuseHeld(w http.ResponseWriter, r *http.Request, src netip.Addr, isGRPC bool) {
	c := call{method: r.URL.Path, source: src}
	reason := fmt.Sprintf("too many calls in flight from this source: %d calls from %s have not ended; end them (a call waiting for its request holds its place until the call timeout), or raise discovery's limits.max_calls_per_source",
		s.calls.Max(), c.src())
	s.refusals.Record(r.Context(), audit.Event{Actor: "anonymous", Action: "api.access", Target: c.method, Result: audit.ResultDenied,
		Reason: reason, Source: c.src()})
	if !isGRPC {
		http.Error(w, reason, http.StatusTooManyRequests)
		return
	}
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Grpc-Status", strconv.Itoa(int(codes.ResourceExhausted)))
	w.Header().Set("Grpc-Message", grpcMessage(reason))
	w.WriteHeader(http.StatusOK)
}

// grpcMessage percent-encodes msg for the grpc-message header (gRPC over
// HTTP/2: every byte outside printable ASCII, and '%').
func grpcMessage(msg string) string {
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(msg))
	for i := 0; i < len(msg); i++ {
		b := msg[i]
		if b < 0x20 || b > 0x7e || b == '%' {
			out = append(out, '%', hex[b>>4], hex[b&0xf])
			continue
		}
		out = append(out, b)
	}
	return string(out)
}
