package listener

import (
	"container/heap"
	"container/list"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Refusal says why a listener closed a connection at once.
type Refusal string

const (
	// RefusedPerSource: the source held MaxConnsPerSource already.
	RefusedPerSource Refusal = "per_source"
	// RefusedTotal: the listener's Cap was full.
	RefusedTotal Refusal = "total"
	// RefusedAnonymous: after its TLS handshake, a connection without a
	// client certificate of the server's found the share of the Cap
	// anonymous callers may hold full (the rest is kept for operators and
	// agents).
	RefusedAnonymous Refusal = "anonymous"
	// RefusedIdentity: after its TLS handshake, a connection found its
	// client identity holding its cap of connections already.
	RefusedIdentity Refusal = "identity"
	// RefusedSilent: the Cap was full, and this connection, which had
	// not sent a byte since its accept (the oldest such of the source
	// holding the most), was closed to make room for a new one
	// (Cap.EvictSilent).
	RefusedSilent Refusal = "silent"
)

// Options are what a listener enforces beside its address.
type Options struct {
	// TrustedProxies are the peers whose PROXY header names a connection's
	// source; they are not counted per source.
	TrustedProxies []netip.Prefix
	// Cap counts the connections open at once, from every source
	// together; listeners given the same Cap share it. nil: a Cap of
	// DefaultMaxConns() for this listener alone.
	Cap *Cap
	// MaxPerSource is the per-source cap; 0: MaxConnsPerSource.
	MaxPerSource int
	// Refused, if set, hears of every connection closed at once. It runs
	// on the accepting goroutine and must not block.
	Refused func(Refusal)
}

// fileHeadroom is what DefaultMaxConns leaves of the open-file limit for
// everything else the process opens: the store's connections and files,
// the audit checkpoint, the listeners' own sockets, the metrics
// listener's few connections (MetricsMaxConns).
const fileHeadroom = 256

// DefaultMaxConns is the default of limits.max_connections, the Cap the
// serving listeners of one process share: the process's open-file limit (RLIMIT_NOFILE, which Go
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

// FileLimit is this process's open-file limit, from which DefaultMaxConns
// is computed, and whether it could be read. Another process's may differ:
// a service manager sets its own (LimitNOFILE in a systemd unit, a
// container's ulimit).
func FileLimit() (uint64, bool) { return fileLimit() }

// DefaultMaxConnsUnknown is the cap where the open-file limit cannot be
// read.
const DefaultMaxConnsUnknown = 10_000

// MetricsMaxConns is the metrics listener's own Cap: scrapes and probes
// are a few connections, and a full serving Cap must not starve the
// probes that tell an orchestrator the process is alive.
const MetricsMaxConns = 64

func maxConnsFor(limit uint64) int {
	const most = 1 << 30
	if limit > most {
		limit = most
	}
	return int(max(limit-min(limit, fileHeadroom), limit/2, 1))
}

// Cap is a count of open connections with a ceiling, shared by the
// listeners given it: the listeners of one process draw on one table of
// file descriptors, so a ceiling per listener would let them together
// hold more than the process may open (limits.max_connections).
type Cap struct {
	max   int
	evict bool

	mu   sync.Mutex
	open int
	// silent are the open connections that have not sent a byte since
	// their accept, kept when evict is set: by source, and the sources in
	// a heap, the one holding the most first.
	silent silentSet
}

// NewCap returns a Cap of max connections; max <= 0 is DefaultMaxConns().
func NewCap(max int) *Cap {
	if max <= 0 {
		max = DefaultMaxConns()
	}
	return &Cap{max: max}
}

// EvictSilent makes c, when full, close a connection that has not sent a
// byte since its accept to take a new one, instead of refusing the new
// one; it returns c. Any client that means to talk sends its first bytes
// (a TLS ClientHello) at once, so a full Cap of connections that say
// nothing — half-open ones, from however many sources — no longer keeps
// everyone else out for the handshake timeout. The one closed is the
// oldest silent connection of the source holding the most silent ones
// (of those holding as many, the one whose oldest is oldest): a flood
// takes its own places, and a client between its connect and its
// ClientHello — one silent connection — is closed only when no source
// holds more than one. Call it before the Cap is used.
func (c *Cap) EvictSilent() *Cap {
	c.evict = true
	return c
}

// Max is the ceiling.
func (c *Cap) Max() int { return c.max }

func (c *Cap) take() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open >= c.max {
		return false
	}
	c.open++
	return true
}

// admit wraps conn, which holds a place taken, so that its close gives
// the place back, and, when the Cap evicts, lists it silent until its
// first byte is read.
func (c *Cap) admit(conn net.Conn) net.Conn {
	cc := &capConn{Conn: conn, cap: c}
	if c.evict {
		c.mu.Lock()
		c.silent.add(cc, sourceOf(conn))
		c.mu.Unlock()
	}
	return cc
}

// sourceOf is the address silent connections are counted by: the TCP
// peer's (a trusted proxy's, for the clients it carries: their PROXY
// header is not read yet).
func sourceOf(conn net.Conn) netip.Addr {
	if tcp, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(tcp.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// evictee takes the silent connection to close off its list: the oldest
// of the source holding the most; nil if there is none. A connection
// whose first bytes have come in but are not read yet (its server
// goroutine is slow to start the handshake) has spoken: it is taken off
// the list and passed over.
func (c *Cap) evictee() *capConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		cc := c.silent.next()
		if cc == nil {
			return nil
		}
		c.silent.remove(cc)
		if !hasSent(cc.Conn) {
			return cc
		}
		cc.spoken.Store(true)
	}
}

// spoke takes cc off the silent list: it sent its first byte.
func (c *Cap) spoke(cc *capConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.silent.remove(cc)
}

func (c *Cap) release(cc *capConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.silent.remove(cc)
	c.open--
}

// capConn holds a place of a Cap until it is closed.
type capConn struct {
	net.Conn
	cap    *Cap
	once   sync.Once
	spoken atomic.Bool
	// On the silent list of src, at elem, accepted as the seq'th; guarded
	// by cap.mu.
	src  *silentSource
	elem *list.Element
	seq  uint64
}

func (c *capConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.cap.evict && !c.spoken.Load() {
		c.spoken.Store(true)
		c.cap.spoke(c)
	}
	return n, err
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.cap.release(c) })
	return err
}

// silentSet holds silent connections by source, each source's oldest
// first, and the sources in a heap ordered by how many they hold (most
// first), then by the age of their oldest: adding, removing and finding
// the next to close cost O(log sources), never a scan under a flood.
type silentSet struct {
	seq     uint64
	sources map[netip.Addr]*silentSource
	heap    silentHeap
}

// silentSource is one source's silent connections, oldest first.
type silentSource struct {
	addr  netip.Addr
	conns list.List
	index int // in silentSet.heap
}

func (s *silentSet) add(cc *capConn, src netip.Addr) {
	if s.sources == nil {
		s.sources = map[netip.Addr]*silentSource{}
	}
	s.seq++
	cc.seq = s.seq
	ss := s.sources[src]
	if ss == nil {
		ss = &silentSource{addr: src}
		s.sources[src] = ss
		ss.conns.PushBack(cc)
		cc.src, cc.elem = ss, ss.conns.Back()
		heap.Push(&s.heap, ss)
		return
	}
	cc.src, cc.elem = ss, ss.conns.PushBack(cc)
	heap.Fix(&s.heap, ss.index)
}

// remove takes cc off, if it is on.
func (s *silentSet) remove(cc *capConn) {
	ss := cc.src
	if ss == nil {
		return
	}
	ss.conns.Remove(cc.elem)
	cc.src, cc.elem = nil, nil
	if ss.conns.Len() == 0 {
		heap.Remove(&s.heap, ss.index)
		delete(s.sources, ss.addr)
		return
	}
	heap.Fix(&s.heap, ss.index)
}

// next is the oldest silent connection of the source holding the most,
// left on; nil if there is none.
func (s *silentSet) next() *capConn {
	if len(s.heap) == 0 {
		return nil
	}
	return s.heap[0].conns.Front().Value.(*capConn)
}

// silentHeap implements heap.Interface over the sources.
type silentHeap []*silentSource

func (h silentHeap) Len() int { return len(h) }

func (h silentHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.conns.Len() != b.conns.Len() {
		return a.conns.Len() > b.conns.Len()
	}
	return a.conns.Front().Value.(*capConn).seq < b.conns.Front().Value.(*capConn).seq
}

func (h silentHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *silentHeap) Push(x any) {
	ss := x.(*silentSource)
	ss.index = len(*h)
	*h = append(*h, ss)
}

func (h *silentHeap) Pop() any {
	old := *h
	ss := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return ss
}

// Listen binds addr over TCP, enforcing o: the total cap, then the cap
// per source (o.MaxPerSource), then the PROXY header from trusted proxies (connections from
// a trusted proxy carry the client address of their PROXY header as their
// remote address, and are counted per source by it once it is read). A
// connection past a cap is closed before anything is read from it (past
// the cap of the source its header names: after the header, before TLS),
// counted through o.Refused.
func Listen(addr string, o Options) (net.Listener, error) {
	lis, err := listen(addr)
	if err != nil {
		return nil, err
	}
	c := o.Cap
	if c == nil {
		c = NewCap(0)
	}
	refused := o.Refused
	if refused == nil {
		refused = func(Refusal) {}
	}
	total := &limitTotal{Listener: lis, cap: c, refused: refused}
	perSource := o.MaxPerSource
	if perSource <= 0 {
		perSource = MaxConnsPerSource
	}
	sources := withSourceLimit(total, perSource, o.TrustedProxies, refused)
	if len(o.TrustedProxies) == 0 {
		return sources, nil
	}
	return &limitProxied{Listener: withTrustedProxies(sources, o.TrustedProxies), sources: sources}, nil
}

// ListenAs binds one of a server's listeners, named "api", "bootstrap"
// or "metrics", drawing on c: the serving ones share one cap
// (limits.max_connections), the metrics listener has a small one of its
// own (NewCap(MetricsMaxConns)), so a full serving cap does not starve
// the probes. One source holds at most MaxPerSource of c. Each connection closed at once is counted and logged
// through rs under name.
func ListenAs(addr, name string, trusted []netip.Prefix, c *Cap, rs *Refusals) (net.Listener, error) {
	return Listen(addr, Options{TrustedProxies: trusted, Cap: c, MaxPerSource: MaxPerSource(c.Max()), Refused: rs.For(name, c.Max())})
}

// limitTotal closes, at once, a new connection while its Cap is full.
type limitTotal struct {
	net.Listener
	cap     *Cap
	refused func(Refusal)
}

func (l *limitTotal) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.cap.take() {
			// Full: a connection that has said nothing, from the
			// source holding the most such, makes room, if the Cap
			// evicts; another listener of the Cap may take the place
			// first.
			if old := l.cap.evictee(); old != nil {
				old.Close()
				l.refused(RefusedSilent)
			}
			if !l.cap.take() {
				c.Close()
				l.refused(RefusedTotal)
				continue
			}
		}
		return l.cap.admit(c), nil
	}
}
