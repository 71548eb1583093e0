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

// limitPerSource closes, at once, a new connection from a source that
// already holds max. Connections from a trusted proxy are not counted:
// their real source is in the PROXY header, read later, and a proxy
// carries many clients.
type limitPerSource struct {
	net.Listener
	max     int
	exempt  []netip.Prefix
	refused func(Refusal)

	mu   sync.Mutex
	open map[netip.Addr]int
}

func withSourceLimit(lis net.Listener, max int, exempt []netip.Prefix, refused func(Refusal)) net.Listener {
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
		l.mu.Lock()
		if l.open[ip] >= l.max {
			l.mu.Unlock()
			c.Close()
			l.refused(RefusedPerSource)
			continue
		}
		l.open[ip]++
		l.mu.Unlock()
		return &countedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
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
