package listener

import (
	"errors"
	"net"
	"net/netip"
	"sync"

	proxyproto "github.com/pires/go-proxyproto"
)

// errSourceFull is what a connection whose PROXY header names a source
// holding MaxConnsPerSource already answers its first read with, closed.
var errSourceFull = errors.New("listener: the connection's source holds its cap of open connections")

// limitProxied counts the connections a trusted proxy carries by the
// source their PROXY header names, on the same tally as direct ones: one
// client behind the load balancer may not hold more than a source may.
// The header is read on the connection's own goroutine, at its first read
// (the TLS handshake), never in Accept, so a slow proxy cannot stall the
// listener; a connection past the cap is closed then, before TLS.
type limitProxied struct {
	net.Listener
	sources *limitPerSource
}

func (l *limitProxied) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	pc, ok := c.(*proxyproto.Conn)
	if !ok {
		return c, nil // not from a trusted proxy: counted in limitPerSource
	}
	return &proxiedConn{Conn: pc, sources: l.sources}, nil
}

// proxiedConn is a connection from a trusted proxy, counted by the source
// in its header from its first read until it is closed.
type proxiedConn struct {
	*proxyproto.Conn
	sources *limitPerSource

	once    sync.Once
	err     error
	mu      sync.Mutex
	counted netip.Addr // valid when taken
	taken   bool
	closed  bool
}

func (c *proxiedConn) Read(b []byte) (int, error) {
	c.once.Do(c.count)
	if c.err != nil {
		return 0, c.err
	}
	return c.Conn.Read(b)
}

// count reads the header and takes a place for its source. A connection
// without a header (a balancer's own health check) is the proxy's, and is
// not counted.
func (c *proxiedConn) count() {
	if c.ProxyHeader() == nil {
		return
	}
	tcp, ok := c.Conn.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return
	}
	ip, _ := netip.AddrFromSlice(tcp.IP)
	ip = ip.Unmap()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if !c.sources.take(ip) {
		c.err = errSourceFull
		c.Conn.Close()
		c.sources.refused(RefusedPerSource)
		return
	}
	c.counted, c.taken = ip, true
}

func (c *proxiedConn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.taken {
		c.sources.release(c.counted)
		c.taken = false
	}
	c.closed = true
	return err
}
