package callinfo

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

func TestCorrelationID(t *testing.T) {
	for _, tc := range []struct {
		name string
		sent []string
		keep bool
	}{
		{"none", nil, false},
		{"plausible", []string{"cli-0123_ABC"}, true},
		{"uuid", []string{"3f0b5a9e-4c1e-4f7a-9d2b-1a2b3c4d5e6f"}, true},
		{"64 characters", []string{strings.Repeat("a", 64)}, true},
		{"too long", []string{strings.Repeat("a", 65)}, false},
		{"empty", []string{""}, false},
		{"log forgery", []string{"x\nlevel=ERROR"}, false},
		{"space", []string{"a b"}, false},
		{"two", []string{"a", "b"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.sent != nil {
				md := metadata.MD{}
				md.Append(CorrelationHeader, tc.sent...)
				ctx = metadata.NewIncomingContext(ctx, md)
			}
			got := CorrelationID(ctx)
			if tc.keep && got != tc.sent[0] {
				t.Errorf("CorrelationID = %q, want the caller's %q", got, tc.sent[0])
			}
			if !tc.keep && (len(got) != 36 || tc.sent != nil && got == tc.sent[0]) {
				t.Errorf("CorrelationID = %q, want a new UUID", got)
			}
		})
	}
}

// textAddr is an address known only by its text, as gRPC's HTTP handler
// transport gives it.
type textAddr string

func (a textAddr) Network() string { return "tcp" }
func (a textAddr) String() string  { return string(a) }

func TestSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr net.Addr
		want string
	}{
		{"IPv4", &net.TCPAddr{IP: net.ParseIP("198.51.100.7"), Port: 40000}, "198.51.100.7"},
		{"IPv6", &net.TCPAddr{IP: net.ParseIP("2001:db8::7"), Port: 40000}, "2001:db8::7"},
		{"IPv4-mapped", textAddr("[::ffff:198.51.100.7]:40000"), "198.51.100.7"},
		{"zone", &net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, "fe80::1%eth0"},
		{"text", textAddr("192.0.2.1:443"), "192.0.2.1"},
		{"not an IP", &net.UnixAddr{Name: "/run/muster.sock", Net: "unix"}, "invalid IP"},
		{"no address", nil, "invalid IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tc.addr})
			if got := Source(ctx).String(); got != tc.want {
				t.Errorf("Source = %s, want %s", got, tc.want)
			}
		})
	}
	if Source(context.Background()) != (netip.Addr{}) {
		t.Error("Source without a peer is not the zero Addr")
	}
}

// TestCallInfoAllocations: reading a call's correlation ID and source
// takes one allocation for the ID (FromIncomingContext copied every
// header) and none for a TCP peer's address (it was printed and parsed).
func TestCallInfoAllocations(t *testing.T) {
	md := metadata.Pairs(CorrelationHeader, "cli-0123", "user-agent", "grpc-go/1", "te", "trailers", "content-type", "application/grpc")
	ctx := metadata.NewIncomingContext(context.Background(), md)
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("198.51.100.7"), Port: 40000}})
	if n := testing.AllocsPerRun(100, func() {
		if CorrelationID(ctx) != "cli-0123" {
			t.Fatal("correlation ID lost")
		}
	}); n > 1 {
		t.Errorf("CorrelationID: %.0f allocations, want at most 1", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if !Source(ctx).IsValid() {
			t.Fatal("no source")
		}
	}); n > 0 {
		t.Errorf("Source: %.0f allocations, want none", n)
	}
}
