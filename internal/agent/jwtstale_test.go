package agent

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// freezingProxy forwards TCP connections to an address until freeze: the
// connections open then stop passing bytes without being closed, as a
// half-open connection does (the peer's host gone, a NAT that forgot the
// flow); connections accepted later are forwarded.
type freezingProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  []*frozenPair
	closed chan struct{}
}

type frozenPair struct {
	mu     sync.Mutex
	frozen bool
}

func newFreezingProxy(t *testing.T, to string) *freezingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{ln: ln, closed: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); close(p.closed); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			pair := &frozenPair{}
			p.mu.Lock()
			p.conns = append(p.conns, pair)
			p.mu.Unlock()
			for _, dir := range [][2]net.Conn{{c, up}, {up, c}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.pipe(pair, dir[0], dir[1])
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-p.closed
				c.Close()
				up.Close()
			}()
		}
	}()
	return p
}

// pipe copies src to dst, dropping what it reads once pair is frozen.
func (p *freezingProxy) pipe(pair *frozenPair, src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		pair.mu.Lock()
		frozen := pair.frozen
		pair.mu.Unlock()
		if frozen {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// freeze stops the connections open now.
func (p *freezingProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.mu.Lock()
		c.frozen = true
		c.mu.Unlock()
	}
}

// A shared connection that went half-open costs one call its deadline,
// not every call after it: the call that timed out drops the connection
// and the next one dials anew and succeeds.
func TestJWTSVIDRedialsAfterAStaleConnection(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	proxy := newFreezingProxy(t, f.addr)
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	st.Authority = proxy.ln.Addr().String()
	if err := dir.writeState(st); err != nil {
		t.Fatal(err)
	}
	a.timeout = time.Second
	if _, _, err := a.JWTSVID(t.Context(), []string{"a"}); err != nil {
		t.Fatal(err)
	}
	proxy.freeze()
	// The workload's context has no deadline: the agent's must end the call.
	done := make(chan error, 1)
	go func() {
		_, _, err := a.JWTSVID(t.Context(), []string{"b"})
		done <- err
	}()
	select {
	case err := <-done:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("a mint over a frozen connection: %v, want DeadlineExceeded", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a mint over a frozen connection did not end")
	}
	base := f.conns.Load()
	tok, _, err := a.JWTSVID(t.Context(), []string{"c"})
	if err != nil {
		t.Fatalf("the mint after a stale connection timed out: %v (it reused the frozen connection)", err)
	}
	if tok != st.Serial {
		t.Fatalf("minted %q, want the serial %s", tok, st.Serial)
	}
	if n := f.conns.Load() - base; n != 1 {
		t.Fatalf("the mint after the timeout opened %d connections, want 1", n)
	}
}

// The shared connection is closed when Run ends: a stopped agent holds no
// connection to the authority.
func TestRunClosesTheSharedConnection(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{ttl: time.Hour})
	a, _ := joined(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nil) }()
	if _, _, err := a.JWTSVID(t.Context(), []string{"a"}); err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); f.open.Load() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections to the authority open after Run ended, want 0", f.open.Load())
		}
	}
}
