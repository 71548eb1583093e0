// Package callinfo reads what muster's gRPC services record of every call,
// on the authority and on discovery alike: the source address it came from
// and the correlation ID that follows it from the CLI into the logs and
// the audit chain. Behind a load balancer the source is the client's only
// when the listener trusts the balancer (package listener); it is never
// taken from anything the caller sends.
package callinfo

import (
	"context"
	"net"
	"net/netip"

	"github.com/google/uuid"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// CorrelationHeader is the metadata key of the correlation ID, in requests
// (set by the CLI) and in response headers.
const CorrelationHeader = "x-correlation-id"

// CorrelationID is the caller's correlation ID when it sent one plausible
// ID (1 to 64 letters, digits, '-' or '_', so it cannot forge log lines),
// and a new random one otherwise.
func CorrelationID(ctx context.Context) string {
	// The one key, not FromIncomingContext's copy of every header (a
	// map and a slice per header, on every call).
	if v := metadata.ValueFromIncomingContext(ctx, CorrelationHeader); len(v) == 1 && validCorrelationID(v[0]) {
		return v[0]
	}
	return uuid.NewString()
}

func validCorrelationID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Source is the IP address of the call's peer (IPv4-mapped addresses as
// IPv4): the TCP peer, or the client a trusted proxy named. It is the zero
// Addr, which is not valid, when the context has no peer or the peer has
// no IP address.
func Source(ctx context.Context) netip.Addr {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}
	}
	if ta, ok := p.Addr.(*net.TCPAddr); ok {
		// The TCP peer as it is, not printed and parsed back.
		return ta.AddrPort().Addr().Unmap()
	}
	if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
		return ap.Addr().Unmap()
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		if a, err := netip.ParseAddr(host); err == nil {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}
