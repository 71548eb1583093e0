package authority

import (
	"crypto/tls"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
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

// ticketsSent runs one handshake of client with server over a pipe, then
// reads one byte the server writes after it (so a NewSessionTicket the
// server sent first reaches the client's cache), and returns how many
// sessions the client was given.
func ticketsSent(t *testing.T, server, client *tls.Config) int32 {
	t.Helper()
	cache := &ticketCounter{ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	client = client.Clone()
	client.ClientSessionCache = cache
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() {
		c := tls.Server(b, server)
		if err := c.Handshake(); err != nil {
			done <- err
			return
		}
		_, err := c.Write([]byte{1})
		done <- err
	}()
	c := tls.Client(a, client)
	if err := c.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatalf("client read: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("server: %v", err)
	}
	return cache.puts.Load()
}

// TestNoSessionTickets: neither listener of the authority sends a session
// ticket, in TLS 1.3 or 1.2, to a client that keeps a session cache and
// would resume with it (serverTLS); the same client is given one by a
// server that allows tickets, so the test sees a ticket when one is sent.
func TestNoSessionTickets(t *testing.T) {
	f := newLeafAloneFixture(t)
	agent := f.identity(t, f.h, ca.RoleAgent, f.h.Root.NotBefore)
	for _, role := range []ca.Role{ca.RoleServer, ca.RoleBootstrap} {
		server, err := f.srv.serverTLS(role, []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
			for _, id := range []*identity.Identity{nil, agent} {
				client := identity.ClientTLS(id, f.h.RootPool(), func(spiffeid.ID) error { return nil })
				client.ServerName = "127.0.0.1"
				client.MinVersion, client.MaxVersion = version, version
				if n := ticketsSent(t, server, client); n != 0 {
					t.Errorf("listener %v, TLS %x, client certificate %v: %d session tickets sent, want none",
						role, version, id != nil, n)
				}
				allowing := server.Clone()
				allowing.SessionTicketsDisabled = false
				if n := ticketsSent(t, allowing, client); n == 0 {
					t.Errorf("listener %v, TLS %x: a server allowing tickets sent none; the test cannot see one", role, version)
				}
			}
		}
	}
}
