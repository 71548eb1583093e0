package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// heldCancel is a cancel request the proxy read and has not yet passed on.
type heldCancel struct {
	packet  []byte
	release chan struct{} // closed by the test: pass it on
	done    chan struct{} // closed once the server has handled it
}

// cancelProxy passes connections on to the server at target, except that
// it holds each cancel request until the test releases it: a cancel
// request the server handles late, as one does under load.
type cancelProxy struct {
	addr    string
	cancels chan *heldCancel
	quit    chan struct{} // closed when the test ends: nothing is held then
}

func startCancelProxy(t *testing.T, target string) *cancelProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cancelProxy{addr: l.Addr().String(), cancels: make(chan *heldCancel, 4), quit: make(chan struct{})}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		open = append(open, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		close(p.quit)
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Go(func() { p.serve(t, c, target, track) })
		}
	})
	return p
}

func (p *cancelProxy) serve(t *testing.T, c net.Conn, target string, track func(net.Conn)) {
	defer c.Close()
	head := make([]byte, 8)
	if _, err := io.ReadFull(c, head); err != nil {
		return
	}
	n := binary.BigEndian.Uint32(head[0:4])
	if binary.BigEndian.Uint32(head[4:8]) == 80877102 && n >= 8 && n < 1024 {
		packet := append(head, make([]byte, n-8)...)
		if _, err := io.ReadFull(c, packet[8:]); err != nil {
			return
		}
		h := &heldCancel{packet: packet, release: make(chan struct{}), done: make(chan struct{})}
		select {
		case p.cancels <- h:
		case <-p.quit:
			return
		}
		select {
		case <-h.release:
		case <-p.quit:
			return
		}
		defer close(h.done)
		s, err := net.Dial("tcp", target)
		if err != nil {
			t.Errorf("proxy: %v", err)
			return
		}
		track(s)
		defer s.Close()
		if _, err := s.Write(packet); err != nil {
			t.Errorf("proxy: %v", err)
			return
		}
		// The server closes a cancel request's connection once it has
		// signalled the backend it names.
		_, _ = io.Copy(io.Discard, s)
		return
	}
	s, err := net.Dial("tcp", target)
	if err != nil {
		t.Errorf("proxy: %v", err)
		return
	}
	track(s)
	defer s.Close()
	if _, err := s.Write(head); err != nil {
		return
	}
	go func() {
		_, _ = io.Copy(s, c)
		s.Close()
	}()
	_, _ = io.Copy(c, s)
}

// TestStrayCancelSparesTheNextRequest: a request whose context ends sends a
// cancel request; its statement then ends by itself (it got the lock it
// waited for) and pgconn stops waiting for the cancel request. One the
// server handles only then, as under load, must not cancel the next
// request run on the pool's (single) connection: it failed with 57014,
// "canceling statement due to user request", a request that had nothing to
// do with the cancelled one.
func TestStrayCancelSparesTheNextRequest(t *testing.T) {
	ctx := t.Context()
	direct := srv.NewDatabase(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCancelProxy(t, u.Host)
	u.Host = proxy.addr
	q := u.Query()
	q.Set("pool_max_conns", "1")
	u.RawQuery = q.Encode()
	d, _, err := newPool(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	holder, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.WithoutCancel(ctx))
	const lockKey = 7341
	lock := func() {
		t.Helper()
		if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
			t.Fatal(err)
		}
	}
	unlock := func() {
		t.Helper()
		if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockKey); err != nil {
			t.Fatal(err)
		}
	}
	waiting := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			var n int
			err := holder.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n)
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no request came to wait for the lock")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(time.Minute):
			t.Fatalf("waited a minute for %s", what)
		}
	}

	// The cancelled request: it waits for the lock, its context ends, and
	// the lock comes before its cancel request reaches the server.
	lock()
	cctx, cancel := context.WithCancel(ctx)
	first := make(chan struct{})
	go func() {
		defer close(first)
		_, err := d.p.Exec(cctx, `SELECT pg_advisory_xact_lock($1)`, lockKey)
		t.Logf("cancelled request: %v", err)
	}()
	waiting()
	cancel()
	var held *heldCancel
	select {
	case held = <-proxy.cancels:
	case <-time.After(time.Minute):
		t.Fatal("no cancel request in a minute")
	}
	unlock()
	waitFor("the cancelled request to end", first)

	// The next request, live, waits for the lock while the late cancel
	// request reaches the server.
	lock()
	second := make(chan error, 1)
	go func() {
		_, err := d.p.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey)
		second <- err
	}()
	waiting()
	close(held.release)
	waitFor("the server to handle the cancel request", held.done)
	unlock()
	var pe *pgconn.PgError
	select {
	case err := <-second:
		if errors.As(err, &pe) && pe.Code == "57014" {
			t.Fatalf("another request's cancel request cancelled this one: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the next request did not end in a minute")
	}
}

// TestServerCancelIsUnavailable: a statement the server cancels while its
// caller still waits (its statement_timeout here) fails with
// store.ErrUnavailable, which the service answers UNAVAILABLE and agents
// retry, not with a bare SQL error answered INTERNAL.
func TestServerCancelIsUnavailable(t *testing.T) {
	ctx := t.Context()
	d, _, err := newPool(ctx, srv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tx, err := d.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '10ms'`); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `SELECT pg_sleep(60)`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("got %v, want the server's statement_timeout (57014)", err)
	}
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("got %v, want store.ErrUnavailable", err)
	}
	t.Log(err)
}
