package authority

import "time"

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
