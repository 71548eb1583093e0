package authority

import (
	"strconv"
	"time"

	"github.com/muster-dev/muster/internal/listener"
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
