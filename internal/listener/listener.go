// Package listener binds the TCP listeners of muster's servers, the
// authority and discovery, and names the hosts their certificates carry.
//
// A connection's source, which per-source rate limits, allowed CIDRs and
// audit records use, is its TCP peer, except that behind a load balancer
// the source comes from a configured trusted proxy only (DESIGN.md, "RPC
// services"): the PROXY protocol header (v1 or v2, HAProxy's
// proxy-protocol.txt) is read from connections whose peer is a trusted
// proxy and never from any other. The package holds no business rule.
package listener

import (
	"context"
	"net"

	"github.com/muster-dev/muster/internal/oserr"
)

// listen binds addr. If the bind fails, the error is the system's reason
// alone ("address already in use"), so the caller's message names addr
// once. Its connections have TCP keep-alive (listenConfig).
func listen(addr string) (net.Listener, error) {
	lis, err := listenConfig().Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, oserr.Reason(err)
	}
	return lis, nil
}

// Addr is the address l is bound to; "" for a nil listener (one that was
// not asked for).
func Addr(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// MaxHeaderListSize caps the header list (gRPC metadata included) a client
// may send on one request, on every muster server. Request bodies are
// already capped before they are parsed; without this cap headers are not,
// and a few unauthenticated calls carrying megabytes of metadata each grow
// the process by gigabytes. muster's own clients send well under 1 KiB.
const MaxHeaderListSize = 16 << 10
