package listener

import (
	"net"
	"net/netip"
	"sync"
)

// MaxConnsPerSource is how many connections one source address may hold
// open on one listener at once. A fleet behind one NAT renews over a few
// connections at a time; whoever opens hundreds of idle or slow TLS
// connections from one address is stopped here, before any handshake.
const MaxConnsPerSource = 256

// MaxPerSource is the per-source cap of a listener whose Cap is capMax:
// MaxConnsPerSource, but never more than half the Cap, so one source's
// connections — half-open ones included, which the Cap counts from their
// accept for up to the handshake timeout — cannot fill a small Cap, nor
// the authority's anonymous share of it (3/4).
func MaxPerSource(capMax int) int {
	return min(MaxConnsPerSource, max(capMax/2, 1))
}

// limitPerSource closes, at once, a new connection from a source that
// already holds max. Connections from a trusted proxy are not counted
// here, as the proxy's: a proxy carries many clients. Their real source,
// in the PROXY header, is counted on the same tally once the header is
// read (limitProxied).
type limitPerSource struct {
	net.Listener
	max     int
	exempt  []netip.Prefix
	refused func(Refusal)

	mu   sync.Mutex
	open map[netip.Addr]int
}

func withSourceLimit(lis net.Listener, max int, exempt []netip.Prefix, refused func(Refusal)) *limitPerSource {
	return &limitPerSource{Listener: lis, max: max, exempt: exempt, open: map[netip.Addr]int{}, refused: refused}
}

func (l *limitPerSource) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tcp, ok := c.RemoteAddr().(*net.TCPAddr)
		if !ok || isTrusted(c.RemoteAddr(), l.exempt) {
			return c, nil
		}
		ip, _ := netip.AddrFromSlice(tcp.IP)
		ip = ip.Unmap()
		if !l.take(ip) {
			c.Close()
			l.refused(RefusedPerSource)
			continue
		}
		return &countedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

// take counts one more connection from ip, unless it holds max already.
func (l *limitPerSource) take(ip netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip] >= l.max {
		return false
	}
	l.open[ip]++
	return true
}

func (l *limitPerSource) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip]--; l.open[ip] <= 0 {
		delete(l.open, ip)
	}
}

// countedConn gives its source's place back when closed, once.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
