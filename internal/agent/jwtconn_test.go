package agent

import (
	"testing"
	"time"
)

// JWT-SVID mints share one connection to the authority while the
// certificate stays the same; after a renewal the next mint presents the
// renewed certificate on a new connection and the old one is closed.
func TestJWTSVIDMintsShareAConnection(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, dir := joined(t, f)
	// The old connection's grace is 2*timeout. The timeout also bounds
	// each dial and call (the renewal's and the mints'), so it stays
	// generous for a loaded -race CI: at 1 s, a renewal's handshake
	// there ran out of it (DeadlineExceeded, waiting for connections).
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
	// grace).
	for deadline := time.Now().Add(2*a.timeout + time.Minute); f.open.Load() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want 1: the old one was not closed", f.open.Load())
		}
	}
}
