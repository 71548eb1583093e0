package callcap

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"
)

func TestTake(t *testing.T) {
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	mapped := netip.MustParseAddr("::ffff:192.0.2.1")
	tests := []struct {
		name string
		// takes are tried in order; want is whether each is let through.
		takes []netip.Addr
		want  []bool
	}{
		{"up to the cap", []netip.Addr{a, a, a}, []bool{true, true, true}},
		{"one past the cap", []netip.Addr{a, a, a, a}, []bool{true, true, true, false}},
		{"another source has its own count", []netip.Addr{a, a, a, b, a}, []bool{true, true, true, true, false}},
		{"IPv4-mapped is the same source", []netip.Addr{a, a, mapped, a}, []bool{true, true, true, false}},
		{"no address is not counted", []netip.Addr{{}, {}, {}, {}, a}, []bool{true, true, true, true, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(3)
			for i, src := range tt.takes {
				_, ok := c.Take(src)
				if ok != tt.want[i] {
					t.Fatalf("take %d from %v: %v, want %v", i+1, src, ok, tt.want[i])
				}
			}
		})
	}
}

func TestReleaseOnce(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.1")
	c := New(2)
	r1, _ := c.Take(a)
	r2, _ := c.Take(a)
	if _, ok := c.Take(a); ok {
		t.Fatal("a third call let through at a cap of 2")
	}
	r1()
	r1() // a second release of the same call gives nothing back
	if got := c.Held(a); got != 1 {
		t.Fatalf("held %d after one call ended (released twice), want 1", got)
	}
	if _, ok := c.Take(a); !ok {
		t.Fatal("a place given back is not taken again")
	}
	r1() // still nothing: the count stays at the two calls in flight
	if _, ok := c.Take(a); ok {
		t.Fatal("a call let through past the cap after a third release of one call")
	}
	r2()
	if got := c.Held(a); got != 1 {
		t.Fatalf("held %d, want 1", got)
	}
}

func TestDefault(t *testing.T) {
	for _, n := range []int{0, -1} {
		if got := New(n).Max(); got != DefaultPerSource {
			t.Errorf("New(%d).Max() = %d, want the default %d", n, got, DefaultPerSource)
		}
	}
}

// withPeer is a call's context as gRPC hands it to a tap handle.
func withPeer(ctx context.Context, ip string) context.Context {
	return peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 4000}})
}

func TestTap(t *testing.T) {
	errRefused := errors.New("refused")
	errNext := errors.New("next refused")
	tests := []struct {
		name     string
		method   string
		next     tap.ServerInHandle
		held     int // calls the source has in flight before
		wantErr  error
		wantHeld int // while the call is in flight
	}{
		{"counted, under the cap", "/counted", nil, 0, nil, 1},
		{"counted, at the cap: refused", "/counted", nil, 2, errRefused, 2},
		{"not counted, at the cap: let through", "/free", nil, 2, nil, 2},
		{"a later handle refuses: the place is given back", "/counted", func(ctx context.Context, _ *tap.Info) (context.Context, error) {
			return nil, errNext
		}, 0, errNext, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(2)
			src := netip.MustParseAddr("192.0.2.7")
			for range tt.held {
				c.Take(src)
			}
			var refusedMethod string
			h := c.Tap(func(m string) bool { return m == "/counted" },
				func(_ context.Context, m string) error { refusedMethod = m; return errRefused }, tt.next)
			ctx, end := context.WithCancel(withPeer(context.Background(), "192.0.2.7"))
			defer end()
			_, err := h(ctx, &tap.Info{FullMethodName: tt.method})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if (tt.wantErr == errRefused) != (refusedMethod == tt.method) {
				t.Errorf("refused reported for %q", refusedMethod)
			}
			if got := c.Held(src); got != tt.wantHeld {
				t.Fatalf("held %d while the call is in flight, want %d", got, tt.wantHeld)
			}
			end()
			// The release runs on its own goroutine once the call's
			// context ends.
			for deadline := time.Now().Add(10 * time.Second); c.Held(src) != tt.held; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("held %d after the call ended, want %d", c.Held(src), tt.held)
				}
			}
		})
	}
}
