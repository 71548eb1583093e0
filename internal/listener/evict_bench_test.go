package listener

import (
	"fmt"
	"net"
	"testing"
)

// fakeConn is a connection from a TCP source that never sends, for
// measuring a Cap without sockets.
type fakeConn struct {
	net.Conn
	from *net.TCPAddr
}

func (c fakeConn) RemoteAddr() net.Addr { return c.from }
func (c fakeConn) Close() error         { return nil }

// BenchmarkEvictUnderFlood measures one accept on a full Cap that
// evicts: the choice of the connection to close, its release and the
// new connection's admission, with the Cap held by silent connections
// from many sources. The cost must grow with the log of the sources, not
// with the connections held.
func BenchmarkEvictUnderFlood(b *testing.B) {
	for _, n := range []struct{ conns, sources int }{{64, 8}, {10_000, 100}, {100_000, 10_000}} {
		b.Run(fmt.Sprintf("conns=%d/sources=%d", n.conns, n.sources), func(b *testing.B) {
			c := NewCap(n.conns).EvictSilent()
			from := make([]*net.TCPAddr, n.sources)
			for i := range from {
				from[i] = &net.TCPAddr{IP: net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)), Port: 1}
			}
			for i := range n.conns {
				c.take()
				c.admit(fakeConn{from: from[i%n.sources]})
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				old := c.evictee()
				if old == nil {
					b.Fatal("nothing to evict on a full Cap of silent connections")
				}
				old.Close()
				if !c.take() {
					b.Fatal("no place after an eviction")
				}
				c.admit(fakeConn{from: from[i%n.sources]})
			}
		})
	}
}
