package agent

import (
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"
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
	// renewal's are closed by their callers, the old shared one once no
	// call is on it).
	for deadline := time.Now().Add(time.Minute); f.open.Load() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want 1: the old one was not closed", f.open.Load())
		}
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
	first, release, err := c.get("k1", "127.0.0.1:1", tc)
	if err != nil {
		t.Fatal(err)
	}
	second, release2, err := c.get("k2", "127.0.0.1:1", tc)
	if err != nil {
		t.Fatal(err)
	}
	if first.conn.GetState() == connectivity.Shutdown {
		t.Fatal("the replaced connection closed under a call in flight")
	}
	release()
	release() // once only
	if first.inflight != 0 || first.conn.GetState() != connectivity.Shutdown {
		t.Fatalf("the replaced connection is %v with %d calls after its last call ended, want closed", first.conn.GetState(), first.inflight)
	}
	c.drop(second)
	if second.conn.GetState() == connectivity.Shutdown {
		t.Fatal("the dropped connection closed under a call in flight")
	}
	release2()
	if second.conn.GetState() != connectivity.Shutdown {
		t.Fatal("the dropped connection stayed open after its last call ended")
	}
	third, release3, _ := c.get("k2", "127.0.0.1:1", tc)
	release3()
	c.close()
	if third == second || third.conn.GetState() != connectivity.Shutdown {
		t.Fatal("after a drop the next call must dial anew, and close must close the held connection")
	}
}
