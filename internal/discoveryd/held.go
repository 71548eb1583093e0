package discoveryd

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/callcap"
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
// or a health watch past callcap.HealthWatches (refused says which),
// before its request is read: RESOURCE_EXHAUSTED in a gRPC trailers-only
// answer, or 429 to an HTTPS request. The refusal is audited through the
// flood guard.
func (s *Server) refuseHeld(w http.ResponseWriter, r *http.Request, src netip.Addr, isGRPC bool, refused error) {
	c := call{method: r.URL.Path, source: src}
	reason := fmt.Sprintf("too many calls in flight from this source: %d calls from %s have not ended; end them (a call waiting for its request holds its place until the call timeout), or raise discovery's limits.max_calls_per_source",
		s.calls.Max(), c.src())
	if rf := (*callcap.Refused)(nil); errors.As(refused, &rf) && rf.Method == healthpb.Health_Watch_FullMethodName {
		// A watch lasts until the call timeout: one source holding
		// many is all it would take to hold the cap for nothing.
		reason = fmt.Sprintf("health watch refused: this source holds %d watches already, the most one source may hold (each lasts up to the call timeout, %s); "+
			"a health checker there should poll grpc.health.v1.Health/Check or watch fewer services, "+
			"and if it is a load balancer's address, name the balancer with --trusted-proxy IP|CIDR (trusted_proxies: in discovery.yaml) and have it send the PROXY header, so each client counts as itself",
			rf.Max, s.callTimeout)
	}
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
