package postgres

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// TestEveryPingFailsIsUnavailable: a database that accepts connections
// but answers no request on them (here a proxy that cuts a connection at
// its first statement; in the field a pooler whose server is gone) fails
// the ping the pool sends before a long request on every connection it
// tries, held and new, and pgxpool then gives up with "too many failed
// attempts acquiring connection": that is store.ErrUnavailable, which
// the authority answers with UNAVAILABLE and agents retry. It was
// returned unmapped.
func TestEveryPingFailsIsUnavailable(t *testing.T) {
	ctx := t.Context()
	u, err := url.Parse(srv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	px := startCutProxy(t, u.Host)
	u.Host = px.addr
	q := u.Query()
	q.Set("pool_max_conns", "2")
	u.RawQuery = q.Encode()
	s := openURL(t, u.String())
	// Both connections held, idle, before the cut.
	c1, _, _, err := s.pool.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, _, _, err := s.pool.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c1.Release()
	c2.Release()

	px.cut.Store(true)
	_, err = s.DeleteTicketUses(ctx) // a long request: pinged first
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("DeleteTicketUses with every ping failing: %v, want ErrUnavailable", err)
	} else if !strings.Contains(err.Error(), "failed its ping") {
		t.Errorf("DeleteTicketUses with every ping failing: %q does not say the pings failed", err)
	}
	if px.cuts.Load() < 3 {
		t.Errorf("%d connections cut, want the pool's 2 held and a new one at least: the ping was not what failed", px.cuts.Load())
	}

	px.cut.Store(false)
	if _, err := s.DeleteTicketUses(ctx); err != nil {
		t.Errorf("DeleteTicketUses once the database answers: %v", err)
	}
}

// cutProxy forwards connections to a PostgreSQL server; while cut is set
// it closes a connection when its client sends a statement (any message
// after the startup but a password), so connecting works and every
// request, a ping included, fails at once.
type cutProxy struct {
	addr string
	cut  atomic.Bool
	cuts atomic.Int32
}

func startCutProxy(t *testing.T, server string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &cutProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { px.serve(c, server) })
		}
	})
	return px
}

func (px *cutProxy) serve(c net.Conn, server string) {
	defer c.Close()
	s, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer s.Close()
	go func() {
		io.Copy(c, s)
		c.Close()
	}()
	// The startup message: a length (itself included), no type.
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return
	}
	body := make([]byte, binary.BigEndian.Uint32(n[:])-4)
	if _, err := io.ReadFull(c, body); err != nil {
		return
	}
	if _, err := s.Write(append(n[:], body...)); err != nil {
		return
	}
	for {
		var h [5]byte // type, then a length (itself included)
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		if px.cut.Load() && h[0] != 'p' {
			px.cuts.Add(1)
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(h[1:])-4)
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		if _, err := s.Write(append(h[:], body...)); err != nil {
			return
		}
	}
}
