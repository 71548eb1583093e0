package listener

import (
	"net"
	"testing"
	"time"
)

// TestConnectionsInAllAreCapped: past its Cap of open connections on the
// listener, from any sources, a new one is closed at once and reported as
// refused for the total; closing one frees its place.
func TestConnectionsInAllAreCapped(t *testing.T) {
	var refused refusals
	lis, err := Listen("127.0.0.1:0", Options{Cap: NewCap(3), Refused: refused.add})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted, dial := acceptAll(lis), dialTo(t, lis.Addr().String())
	var server []net.Conn
	for range 3 {
		dial()
		server = append(server, <-accepted)
	}
	if !closedAtOnce(dial(), 2*time.Second) {
		t.Fatal("the fourth connection was not closed at once")
	}
	// The refusal is reported as the connection is closed, which the
	// dialer may see first.
	var got []Refusal
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = refused.all(); len(got) > 0 {
			break
		}
	}
	if len(got) != 1 || got[0] != RefusedTotal {
		t.Fatalf("refusals %v, want one for the total", got)
	}
	server[0].Close()
	next := dial()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a connection was refused after one of the three closed")
	}
	if closedAtOnce(next, 200*time.Millisecond) {
		t.Fatal("the connection after a close was closed")
	}
}

// TestListenersShareACap: listeners given one Cap draw on it together, as
// a process's listeners draw on one table of descriptors: what one holds,
// the other cannot open, and a close on one frees a place for the other.
func TestListenersShareACap(t *testing.T) {
	c := NewCap(2)
	a, err := Listen("127.0.0.1:0", Options{Cap: c})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Listen("127.0.0.1:0", Options{Cap: c})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	acceptedA, dialA := acceptAll(a), dialTo(t, a.Addr().String())
	acceptedB, dialB := acceptAll(b), dialTo(t, b.Addr().String())
	dialA()
	held := <-acceptedA
	dialB()
	<-acceptedB
	if !closedAtOnce(dialB(), 2*time.Second) {
		t.Fatal("a third connection across two listeners sharing a cap of 2 was kept")
	}
	held.Close()
	next := dialB()
	select {
	case c := <-acceptedB:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a place freed on one listener was not given to the other")
	}
	if closedAtOnce(next, 200*time.Millisecond) {
		t.Fatal("the connection after a close was closed")
	}
}

// TestCapDefault: limits.max_connections in force, as the server and
// --check-config both take it: the value, or for 0 (or less) the default
// from the open-file limit.
func TestCapDefault(t *testing.T) {
	for _, tt := range []struct{ configured, want int }{{0, DefaultMaxConns()}, {-1, DefaultMaxConns()}, {5, 5}} {
		if got := NewCap(tt.configured).Max(); got != tt.want {
			t.Errorf("NewCap(%d).Max() = %d, want %d", tt.configured, got, tt.want)
		}
	}
}

func TestMaxConnsFor(t *testing.T) {
	for _, tt := range []struct {
		limit uint64
		want  int
	}{
		{1 << 20, 1<<20 - 256},
		{20_000, 19_744},
		{1024, 768},
		{300, 150}, // at least half
		{1, 1},
		{0, 1},
		{^uint64(0), 1<<30 - 256}, // RLIM_INFINITY
	} {
		if got := maxConnsFor(tt.limit); got != tt.want {
			t.Errorf("maxConnsFor(%d) = %d, want %d", tt.limit, got, tt.want)
		}
	}
}

// TestMaxPerSource: one source holds at most half a small cap, so it
// cannot fill the authority's anonymous share (3/4) of it.
func TestMaxPerSource(t *testing.T) {
	for capMax, want := range map[int]int{1: 1, 2: 1, 64: 32, 512: 256, 100_000: MaxConnsPerSource} {
		if got := MaxPerSource(capMax); got != want {
			t.Errorf("MaxPerSource(%d) = %d, want %d", capMax, got, want)
		}
		if capMax >= 4 && MaxPerSource(capMax) >= capMax*3/4 {
			t.Errorf("MaxPerSource(%d) is not below the anonymous share", capMax)
		}
	}
}

// TestFullCapEvictsTheOldestSilent: a full Cap that evicts takes a new
// connection in place of the oldest that has sent nothing, reported as
// silent; connections that spoke, read or not yet read, are never closed
// for it.
func TestFullCapEvictsTheOldestSilent(t *testing.T) {
	var refused refusals
	lis, err := Listen("127.0.0.1:0", Options{Cap: NewCap(4).EvictSilent(), Refused: refused.add})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted, dial := acceptAll(lis), dialTo(t, lis.Addr().String())
	// speak sends a byte on client and reads it on server.
	speak := func(client, server net.Conn) {
		t.Helper()
		if _, err := client.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if _, err := server.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	// unread has sent a byte the server has not read yet (its goroutine
	// is slow to start): it has spoken, and is passed over.
	unread := dial()
	if _, err := unread.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	<-accepted
	talker := dial()
	speak(talker, <-accepted)
	time.Sleep(100 * time.Millisecond) // unread's byte is in the server's socket
	silent1 := dial()
	<-accepted
	silent2 := dial()
	<-accepted
	// Full: the next takes the place of silent1, the oldest silent.
	next := dial()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a new connection was refused while a silent one held a place")
	}
	if !closedAtOnce(silent1, 2*time.Second) {
		t.Fatal("the oldest silent connection was not closed")
	}
	if closedAtOnce(silent2, 200*time.Millisecond) || closedAtOnce(talker, 200*time.Millisecond) || closedAtOnce(next, 200*time.Millisecond) ||
		closedAtOnce(unread, 200*time.Millisecond) {
		t.Fatal("a connection other than the oldest silent one was closed")
	}
	var got []Refusal
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = refused.all(); len(got) > 0 {
			break
		}
	}
	if len(got) != 1 || got[0] != RefusedSilent {
		t.Fatalf("refusals %v, want one silent", got)
	}
}

// TestCapWithoutEvictionRefuses: a Cap that does not evict refuses the
// next connection even when those holding it are silent.
func TestCapWithoutEvictionRefuses(t *testing.T) {
	lis, err := Listen("127.0.0.1:0", Options{Cap: NewCap(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted, dial := acceptAll(lis), dialTo(t, lis.Addr().String())
	first := dial()
	<-accepted
	if !closedAtOnce(dial(), 2*time.Second) || closedAtOnce(first, 200*time.Millisecond) {
		t.Fatal("a Cap without eviction closed the silent connection, not the new one")
	}
}

// TestFullCapEvictsFromTheSourceHoldingMost: on a full Cap that evicts, a
// new connection takes the place of the oldest silent connection of the
// source holding the most, so a client from its own source, between its
// connect and its ClientHello and the oldest silent connection of all,
// survives a flood from several sources that hold many
// (TestHalfOpenFloodFromManySources). Before, it was the first closed.
func TestFullCapEvictsFromTheSourceHoldingMost(t *testing.T) {
	var refused refusals
	lis, err := Listen("127.0.0.1:0", Options{Cap: NewCap(8).EvictSilent(), Refused: refused.add})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := acceptAll(lis)
	// dial connects from src, a loopback address of its own, and waits
	// for the server to hold the connection.
	dial := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		select {
		case s := <-accepted:
			t.Cleanup(func() { s.Close() })
		case <-time.After(5 * time.Second):
			t.Fatalf("a connection from %s was not accepted", src)
		}
		return c
	}
	victim := dial("127.0.0.1")
	var a, b []net.Conn
	for range 4 {
		a = append(a, dial("127.0.0.2"))
	}
	for range 3 {
		b = append(b, dial("127.0.0.3"))
	}
	// Full, victim the oldest silent: the next takes the place of the
	// oldest of 127.0.0.2's four.
	b = append(b, dial("127.0.0.3"))
	if !closedAtOnce(a[0], 2*time.Second) {
		t.Fatal("the oldest connection of the source holding the most was not closed")
	}
	// Both flooding sources redial: they take each other's places, never
	// the victim's, while either holds more than one.
	for i := range 20 {
		if i%2 == 0 {
			a = append(a, dial("127.0.0.2"))
		} else {
			b = append(b, dial("127.0.0.3"))
		}
	}
	if closedAtOnce(victim, 200*time.Millisecond) {
		t.Fatal("the single silent connection of its source was closed while other sources held several")
	}
	// Of the flood, the newest of each source are open: 4 and 3.
	for _, c := range append(a[len(a)-3:], b[len(b)-3:]...) {
		if closedAtOnce(c, 50*time.Millisecond) {
			t.Fatal("one of the newest flood connections was closed")
		}
	}
	var got []Refusal
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = refused.all(); len(got) >= 21 {
			break
		}
	}
	if len(got) != 21 {
		t.Fatalf("%d refusals, want 21 silent: %v", len(got), got)
	}
	for _, r := range got {
		if r != RefusedSilent {
			t.Fatalf("refusals %v, want only silent", got)
		}
	}
}
