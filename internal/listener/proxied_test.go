package listener

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// TestProxiedSourcesAreCapped: connections a trusted proxy carries are
// counted by the source their PROXY header names: past MaxConnsPerSource
// from one client, the next is closed at its first read (before TLS) and
// counted as refused per source, while another client behind the same
// proxy is served; closing one frees its place.
func TestProxiedSourcesAreCapped(t *testing.T) {
	var refused refusals
	lis, err := Listen("127.0.0.1:0", Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Refused: refused.add})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	// The server reads each connection as TLS would: the first read
	// counts it; what it reads or the error it gets is handed over.
	type read struct {
		conn net.Conn
		data string
		err  error
	}
	reads := make(chan read, MaxConnsPerSource+8)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				b := make([]byte, 5)
				n, err := c.Read(b)
				reads <- read{c, string(b[:n]), err}
			}()
		}
	}()
	dial := dialTo(t, lis.Addr().String())
	send := func(client string) net.Conn {
		c := dial()
		if _, err := c.Write(append(v2Header(t, client), "hello"...)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var held []read
	for i := range MaxConnsPerSource {
		send("198.51.100.7:" + strconv.Itoa(40000+i))
		r := <-reads
		if r.err != nil || r.data != "hello" {
			t.Fatalf("connection %d from the client: %q, %v", i, r.data, r.err)
		}
		held = append(held, r)
	}
	over := send("198.51.100.7:50000")
	if r := <-reads; !errors.Is(r.err, errSourceFull) {
		t.Fatalf("a connection past the client's cap read %q, %v; want it refused", r.data, r.err)
	}
	if !closedAtOnce(over, 2*time.Second) {
		t.Fatal("a connection past the client's cap was not closed")
	}
	got := refused.all()
	if len(got) != 1 || got[0] != RefusedPerSource {
		t.Fatalf("refusals %v, want one per source", got)
	}
	send("198.51.100.8:40000")
	if r := <-reads; r.err != nil || r.data != "hello" {
		t.Fatalf("another client behind the proxy: %q, %v; want it served", r.data, r.err)
	}
	held[0].conn.Close()
	send("198.51.100.7:50001")
	if r := <-reads; r.err != nil || r.data != "hello" {
		t.Fatalf("after a close, the client: %q, %v; want its place back", r.data, r.err)
	}
}
