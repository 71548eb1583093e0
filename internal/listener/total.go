package listener

import (
	"net"
	"net/netip"
	"sync"
)

// Refusal says why a listener closed a connection at once.
type Refusal string

const (
	// RefusedPerSource: the source held MaxConnsPerSource already.
	RefusedPerSource Refusal = "per_source"
	// RefusedTotal: the listener held its MaxConns already.
	RefusedTotal Refusal = "total"
)

// Options are what a listener enforces beside its address.
type Options struct {
	// TrustedProxies are the peers whose PROXY header names a connection's
	// source; they are not counted per source.
	TrustedProxies []netip.Prefix
	// MaxConns caps the connections open on the listener at once, from
	// every source together (limits.max_connections); 0 is
	// DefaultMaxConns().
	MaxConns int
	// Refused, if set, hears of every connection closed at once. It runs
	// on the accepting goroutine and must not block.
	Refused func(Refusal)
}

// fileHeadroom is what DefaultMaxConns leaves of the open-file limit for
// everything else the process opens: the store's connections and files,
// the audit checkpoint, the other listeners' sockets.
const fileHeadroom = 256

// DefaultMaxConns is the connection cap of a listener whose Options leave
// MaxConns at 0: the process's open-file limit (RLIMIT_NOFILE, which Go
// raises to the hard limit at start) minus 256 descriptors of headroom,
// and at least half of the limit. Past it, accept(2) fails with EMFILE,
// and servers retry it in a loop while the connections wait unanswered:
// the cap closes the excess at once instead. Where the limit is unknown,
// DefaultMaxConnsUnknown.
func DefaultMaxConns() int {
	n, ok := fileLimit()
	if !ok {
		return DefaultMaxConnsUnknown
	}
	return maxConnsFor(n)
}

// DefaultMaxConnsUnknown is the cap where the open-file limit cannot be
// read.
const DefaultMaxConnsUnknown = 10_000

func maxConnsFor(limit uint64) int {
	const most = 1 << 30
	if limit > most {
		limit = most
	}
	return int(max(limit-min(limit, fileHeadroom), limit/2, 1))
}

// Listen binds addr over TCP, enforcing o: the total cap, then the cap
// per source, then the PROXY header from trusted proxies (connections from
// a trusted proxy carry the client address of their PROXY header as their
// remote address). A connection past a cap is closed before anything is
// read from it, counted through o.Refused.
func Listen(addr string, o Options) (net.Listener, error) {
	lis, err := listen(addr)
	if err != nil {
		return nil, err
	}
	maxConns := o.MaxConns
	if maxConns <= 0 {
		maxConns = DefaultMaxConns()
	}
	refused := o.Refused
	if refused == nil {
		refused = func(Refusal) {}
	}
	total := &limitTotal{Listener: lis, max: maxConns, refused: refused}
	return withTrustedProxies(withSourceLimit(total, MaxConnsPerSource, o.TrustedProxies, refused), o.TrustedProxies), nil
}

// limitTotal closes, at once, a new connection while max are open.
type limitTotal struct {
	net.Listener
	max     int
	refused func(Refusal)

	mu   sync.Mutex
	open int
}

func (l *limitTotal) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		full := l.open >= l.max
		if !full {
			l.open++
		}
		l.mu.Unlock()
		if full {
			c.Close()
			l.refused(RefusedTotal)
			continue
		}
		return &countedConn{Conn: c, release: l.release}, nil
	}
}

func (l *limitTotal) release() {
	l.mu.Lock()
	l.open--
	l.mu.Unlock()
}
