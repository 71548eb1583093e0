package authority

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/muster-dev/muster/internal/callcap"
	"github.com/muster-dev/muster/internal/calldeadline"
	"github.com/muster-dev/muster/internal/callinfo"
	"github.com/muster-dev/muster/internal/listener"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// The unauthenticated RPCs allow each source a burst of 20 requests and 5
// per second after it: ample for a fleet behind one NAT rebooting at once,
// and it keeps one source from guessing secrets or burning CPU on
// signatures.
const (
	bootstrapRate  = 5
	bootstrapBurst = 20
)

// Connection limits of the authority's listeners, besides the per-source
// cap of listener.MaxConnsPerSource: a client that connects and says
// nothing, or goes quiet, does not hold a connection for long, and one
// connection cannot carry an unbounded number of concurrent calls.
const (
	handshakeTimeout = 10 * time.Second
	idleTimeout      = 5 * time.Minute
	maxStreams       = 100
)

// streamReadBuffer is the read buffer gRPC puts in front of each
// connection: none. gRPC's default, 32 KiB, was half of what an idle agent
// stream cost the authority (a heap profile with 2,000 streams open), and
// even a 4 KiB one cost 4.8 KiB of heap a stream. The connection under gRPC is TLS, which
// decrypts a whole record into a buffer of its own and answers reads from
// it, so a second buffer saved no system calls: without it the HTTP/2
// framer makes one more in-memory read per frame. (Write buffers are
// shared by gRPC already: a connection holds one only while it writes.)
const streamReadBuffer = 0

// openFileLimit is the open-file limit this process runs with, for the
// start log beside the cap it applies: --check-config reads its own
// process's, which a service manager may set otherwise (LimitNOFILE).
func openFileLimit() string {
	if n, ok := listener.FileLimit(); ok {
		return strconv.FormatUint(n, 10)
	}
	return "unknown"
}

// DefaultCallTimeout is limits.call_timeout's default: longer than any
// call muster's own clients make (the admin CLI waits 30 s by default; a
// root rotation's update_servers waits up to 30 s for the intermediates).
const DefaultCallTimeout = time.Minute

// DefaultRenewalsPerLifetime is limits.renewals_per_lifetime's default:
// an instance may renew 10 times at once, and 10 times in each lifetime
// of its certificates after that. An agent renews at half-life (±10%),
// about twice a lifetime; a renewal answered as a retry, or refused, is
// not counted. So the rest is room for an operator's muster agent renew
// by hand, a key rotation, a bound-keypair refresh after a rotation,
// while a script renewing in a loop, or a stolen certificate renewing
// without pause, is refused after its tenth signature.
const DefaultRenewalsPerLifetime = 10

// DefaultMaxCallsPerSource is limits.max_calls_per_source's default
// (callcap.DefaultPerSource, which says why).
const DefaultMaxCallsPerSource = callcap.DefaultPerSource

// selfBounded are the calls that bound their own time, so callDeadline
// leaves them be: an agent's stream lasts until its certificate expires,
// one per identity, and a send to it waits at most streamSendTimeout; a
// bound-keypair join waits for each answer at most a challenge's
// lifetime, and lasts that and 10 s in all (join.go); a health watch
// lasts healthWatchFor, 64 at once (health.go).
var selfBounded = map[string]bool{
	musterv1.AgentService_Connect_FullMethodName:                  true,
	musterv1.JoinService_RegisterUsingBoundKeypair_FullMethodName: true,
	healthpb.Health_Watch_FullMethodName:                          true,
}

// callTap (gRPC's InTapHandle, run as a call's headers arrive, before
// its request is read) counts the call against its source's
// limits.max_calls_per_source, refusing one past it, and then gives it
// its deadline (callDeadline).
//
// Every call is counted but agents' streams: each lasts as long as its
// agent's certificate, one per identity (a new one replaces the old), so
// thousands of agents behind one NAT address hold thousands of them, all
// legitimately, and an anonymous one is refused by the stream
// interceptor as soon as it starts. Health watches and bound-keypair
// joins, which bound their own time, are counted: one source does not
// need many of them at once; of health watches it holds at most
// callcap.HealthWatches, refused with a reason of their own.
func (s *Server) callTap() tap.ServerInHandle {
	return s.calls.Tap(func(method string) bool { return method != musterv1.AgentService_Connect_FullMethodName },
		func(ctx context.Context, method string, r *callcap.Refused) error {
			if r.Method == healthpb.Health_Watch_FullMethodName {
				s.refuseUnread(ctx, method, fmt.Sprintf("health watch refused: this source holds %d watches already, the most one source may hold "+
					"(each lasts up to %s); a health checker there should poll grpc.health.v1.Health/Check or watch fewer services, "+
					"and if it is a load balancer's address, name the balancer with --trusted-proxy IP|CIDR (trusted_proxies: in authority.yaml) and have it send the PROXY header, so each client counts as itself",
					r.Max, healthWatchFor))
				return status.Errorf(codes.ResourceExhausted, "this source holds %d health watches already, the most one source may; end one, or use Check", r.Max)
			}
			reason := fmt.Sprintf("too many calls in flight from this source: limits.max_calls_per_source (%d) calls from %s have not ended; end them (a call waiting for its request holds its place until limits.call_timeout), or raise limits.max_calls_per_source",
				s.calls.Max(), callinfo.Source(ctx))
			s.refuseUnread(ctx, method, reason)
			return status.Error(codes.ResourceExhausted, reason)
		}, s.callDeadline())
}

// callDeadline (gRPC's InTapHandle, run as a call's headers arrive) gives
// every call but the selfBounded ones a deadline of limits.call_timeout
// when its caller gave none or a later one. A connection carrying a call
// is never idle (idleTimeout), so without it a call whose request never
// came (or a reflection stream, which answers for as long as it is
// asked) held its place among the connection's maxStreams, and the
// connection, for good. The call is answered DEADLINE_EXCEEDED and its
// refusal audited, with the method and source.
func (s *Server) callDeadline() tap.ServerInHandle {
	return calldeadline.Tap(s.callTimeout, func(method string) bool { return !selfBounded[method] },
		func(ctx context.Context, method string) {
			s.refuseUnread(ctx, method, fmt.Sprintf("the call lasted longer than limits.call_timeout (%s): send the request whole and read the reply within it, or raise limits.call_timeout", s.callTimeout))
		})
}
