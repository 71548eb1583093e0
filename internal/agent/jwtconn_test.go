package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/jwtsvid"
)

// JWT-SVID mints share one connection to the authority while the
// certificate stays the same; after a renewal the next mint presents the
// renewed certificate on a new connection and the old one is closed.
func TestJWTSVIDMintsShareAConnection(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	// The timeout bounds each dial and call (the renewal's and the
	// mints'), so it stays generous for a loaded -race CI: at 1 s, a
	// renewal's handshake there ran out of it (DeadlineExceeded, waiting
	// for connections).
	a.timeout = 5 * time.Second
	st, _ := dir.ReadState()
	base := f.conns.Load()
	for _, aud := range []string{"a", "b", "c"} {
		tok, _, err := a.JWTSVID(t.Context(), []string{aud})
		if err != nil {
			t.Fatal(err)
		}
		if tok != st.Serial {
			t.Fatalf("minted over a connection presenting %s, want %s", tok, st.Serial)
		}
	}
	if n := f.conns.Load() - base; n != 1 {
		t.Fatalf("three mints opened %d connections, want 1", n)
	}
	renewed, err := a.Renew(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	base = f.conns.Load()
	tok, _, err := a.JWTSVID(t.Context(), []string{"d"})
	if err != nil {
		t.Fatal(err)
	}
	if tok != renewed.Serial {
		t.Fatalf("after the renewal, minted over a connection presenting %s, want the renewed %s", tok, renewed.Serial)
	}
	if n := f.conns.Load() - base; n != 1 {
		t.Fatalf("the mint after a renewal opened %d connections, want 1", n)
	}
	// Only the new shared connection stays open (the join's and the
	// renewal's are closed by their callers, the old shared one after its
	// last call on it ended).
	for deadline := time.Now().Add(time.Minute); f.open.Load() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want 1: the old one was not closed", f.open.Load())
		}
	}
}

// TestOldConnectionClosedWhenItsLastCallEnds: the connection a renewal
// replaced is closed when the last call on it ends, whatever the call
// timeout: a call in flight on it then finishes on it, and with a long
// --timeout the connection is not held idle. Before, it was closed twice
// the call timeout after it was replaced (two hours here), however idle,
// and so was every connection a call found the authority unavailable on.
func TestOldConnectionClosedWhenItsLastCallEnds(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, _ := joined(t, f)
	a.timeout = time.Hour
	if _, _, err := a.JWTSVID(t.Context(), []string{"a"}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	hold, held := make(chan struct{}), make(chan struct{})
	f.mintHold, f.mintHeld = hold, held
	f.mu.Unlock()
	inFlight := make(chan error, 1)
	go func() {
		_, _, err := a.JWTSVID(t.Context(), []string{"b"})
		inFlight <- err
	}()
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("the mint did not reach the authority")
	}
	renewed, err := a.Renew(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := a.JWTSVID(t.Context(), []string{"c"})
	if err != nil || tok != renewed.Serial {
		t.Fatalf("the mint after the renewal: %q, %v; want the renewed %s", tok, err, renewed.Serial)
	}
	close(hold)
	if err := <-inFlight; err != nil {
		t.Fatalf("the call in flight on the replaced connection: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); f.open.Load() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open a minute after the last call on the old one ended, want 1", f.open.Load())
		}
	}
}

// TestJWTSVIDReusedForHalfItsLifetimeWhateverTheClocks: a minted
// JWT-SVID is handed out again for half its lifetime (exp less iat, the
// authority's clock both) from when it was asked for (the agent's), so an
// agent whose clock is minutes off the authority's reuses a 5-minute
// token for 2.5 minutes, as one in step does. Before, the token's exp
// (the authority's clock) was compared with the agent's: 10 minutes
// behind the authority, it handed the token out for 7.5 minutes (5 past
// its expiry, which relying parties refuse); 10 minutes ahead, never.
func TestJWTSVIDReusedForHalfItsLifetimeWhateverTheClocks(t *testing.T) {
	for _, skew := range []time.Duration{-10 * time.Minute, 0, 10 * time.Minute} {
		t.Run("authority "+skew.String(), func(t *testing.T) {
			f := newFakeAuthority(t, fakeOptions{})
			a, _ := joined(t, f)
			priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			iss, err := jwtsvid.NewIssuer(jwtsvid.Key{ID: "v1-a", Priv: priv})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			clock := time.Now()
			at := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
			a.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
			f.mu.Lock()
			f.mintJWT, f.mintClock = iss, func() time.Time { return a.now().Add(skew) }
			f.mu.Unlock()
			first, _, err := a.JWTSVID(t.Context(), []string{"db"})
			if err != nil {
				t.Fatal(err)
			}
			at(2 * time.Minute)
			if tok, _, err := a.JWTSVID(t.Context(), []string{"db"}); err != nil || tok != first {
				t.Fatalf("2 minutes after the mint (of 5): a new token (%v), want the first reused", err)
			}
			at(time.Minute)
			if tok, _, err := a.JWTSVID(t.Context(), []string{"db"}); err != nil || tok == first {
				t.Fatalf("3 minutes after the mint (of 5): the first token handed out again (%v), want a new one", err)
			}
		})
	}
}

// An agent renewing more often than its call timeout holds one shared
// connection, not one per renewal: the old one is closed as soon as no
// call is on it, not a grace of two call timeouts later (with 20-second
// certificates and the default 30-second timeout, an agent serving JWT-SVIDs
// held 8 connections and the authority refused its renewals, past its
// share of one agent's connections). The timeout here is ten minutes, so
// the old grace would keep every replaced connection open for twenty.
func TestJWTSVIDConnectionClosesWithItsLastCall(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, _ := joined(t, f)
	a.timeout = 10 * time.Minute
	for i := range 3 {
		if _, err := a.Renew(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, _, err := a.JWTSVID(t.Context(), []string{fmt.Sprint("aud", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(time.Minute); f.open.Load() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open after three renewals and mints, want 1: replaced connections with no call on them stay open", f.open.Load())
		}
	}
}

// A replaced connection with a call in flight stays open until that call
// ends, then closes; dropping one does the same.
func TestSharedAuthorityConnWaitsForItsCalls(t *testing.T) {
	var c authorityConn
	tc := func() *tls.Config { return &tls.Config{} }
	first, err := c.get("k1", "127.0.0.1:1", tc)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.get("k2", "127.0.0.1:1", tc)
	if err != nil {
		t.Fatal(err)
	}
	if first.conn.GetState() == connectivity.Shutdown {
		t.Fatal("the replaced connection closed under a call in flight")
	}
	c.release(first)
	if first.calls != 0 || first.conn.GetState() != connectivity.Shutdown {
		t.Fatalf("the replaced connection is %v with %d calls after its last call ended, want closed", first.conn.GetState(), first.calls)
	}
	c.drop(second)
	if second.conn.GetState() == connectivity.Shutdown {
		t.Fatal("the dropped connection closed under a call in flight")
	}
	c.release(second)
	if second.conn.GetState() != connectivity.Shutdown {
		t.Fatal("the dropped connection stayed open after its last call ended")
	}
	third, _ := c.get("k2", "127.0.0.1:1", tc)
	c.release(third)
	c.close()
	if third == second || third.conn.GetState() != connectivity.Shutdown {
		t.Fatal("after a drop the next call must dial anew, and close must close the held connection")
	}
}

// A call after close (a workload's JWT-SVID request served while agent
// run shuts down, after Run closed the shared connection) dialled a
// connection that nothing closed any more; it is refused instead.
func TestSharedAuthorityConnDialsNothingAfterClose(t *testing.T) {
	var c authorityConn
	tc := func() *tls.Config { return &tls.Config{} }
	first, err := c.get("k1", "127.0.0.1:1", tc)
	if err != nil {
		t.Fatal(err)
	}
	c.close()
	c.release(first)
	if first.conn.GetState() != connectivity.Shutdown {
		t.Fatal("close left the held connection open")
	}
	sc, err := c.get("k1", "127.0.0.1:1", tc)
	if err == nil {
		c.release(sc)
		sc.conn.Close()
		t.Fatal("a call after close dialled a connection nothing closes")
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a call after close: %v, want UNAVAILABLE", err)
	}
}
