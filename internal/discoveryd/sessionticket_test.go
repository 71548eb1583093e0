package discoveryd

import (
	"crypto/tls"
	"io"
	"sync/atomic"
	"testing"
)

// ticketCounter is a client session cache that counts the sessions a
// server's tickets gave it.
type ticketCounter struct {
	tls.ClientSessionCache
	puts atomic.Int32
}

func (c *ticketCounter) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil {
		c.puts.Add(1)
	}
	c.ClientSessionCache.Put(key, cs)
}

// TestNoSessionTickets: discovery's listener sends no session ticket, in
// TLS 1.3 or 1.2, to a client that keeps a session cache and would resume
// with it. The client reads a whole HTTP answer, so a ticket sent after
// the handshake has reached its cache.
func TestNoSessionTickets(t *testing.T) {
	e := start(t)
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		cache := &ticketCounter{ClientSessionCache: tls.NewLRUClientSessionCache(4)}
		c, err := tls.Dial("tcp", e.addr, &tls.Config{MinVersion: version, MaxVersion: version,
			InsecureSkipVerify: true, ClientSessionCache: cache})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "GET /.well-known/jwks.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(c); err != nil {
			t.Fatal(err)
		}
		c.Close()
		if n := cache.puts.Load(); n != 0 {
			t.Errorf("TLS %x: %d session tickets sent, want none", version, n)
		}
	}
}
