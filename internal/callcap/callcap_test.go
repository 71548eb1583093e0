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
				_, err := c.Take(src, "/m")
				if (err == nil) != tt.want[i] {
					t.Fatalf("take %d from %v: %v, want let through %v", i+1, src, err, tt.want[i])
				}
			}
		})
	}
}

func TestReleaseOnce(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.1")
	c := New(2)
	r1, _ := c.Take(a, "/m")
	r2, _ := c.Take(a, "/m")
	if _, err := c.Take(a, "/m"); err == nil {
		t.Fatal("a third call let through at a cap of 2")
	}
	r1()
	r1() // a second release of the same call gives nothing back
	if got := c.Held(a); got != 1 {
		t.Fatalf("held %d after one call ended (released twice), want 1", got)
	}
	if _, err := c.Take(a, "/m"); err != nil {
		t.Fatal("a place given back is not taken again")
	}
	r1() // still nothing: the count stays at the two calls in flight
	if _, err := c.Take(a, "/m"); err == nil {
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
				c.Take(src, "/other")
			}
			var refusedMethod string
			h := c.Tap(func(m string) bool { return m == "/counted" },
				func(_ context.Context, m string, r *Refused) error {
					if r == nil || r.Source != src || r.Max != 2 {
						t.Errorf("refused with %+v", r)
					}
					refusedMethod = m
					return errRefused
				}, tt.next)
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

// TestBound: a method with a Bound of its own is refused past it, from
// one source, while the source's other calls and another source's calls
// of the method go on; each of its calls counts against the source's cap
// too, and a release gives both places back.
func TestBound(t *testing.T) {
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	const watch = "/grpc.health.v1.Health/Watch"
	c := New(5, Bound{Method: watch, PerSource: 2})
	var releases []func()
	for i := range 2 {
		r, err := c.Take(a, watch)
		if err != nil {
			t.Fatalf("watch %d of a source within its bound: %v", i+1, err)
		}
		releases = append(releases, r)
	}
	_, err := c.Take(a, watch)
	var r *Refused
	if !errors.As(err, &r) || r.Method != watch || r.Max != 2 || r.Source != a {
		t.Fatalf("a third watch of a bound of 2: %v, want refused past the method's bound", err)
	}
	if _, err := c.Take(b, watch); err != nil {
		t.Fatalf("another source's watch: %v", err)
	}
	if got := c.Held(a); got != 2 {
		t.Fatalf("the source's calls held %d, want its 2 watches counted", got)
	}
	for i := range 3 {
		if _, err := c.Take(a, "/other"); err != nil {
			t.Fatalf("other call %d of the source, within the cap: %v", i+1, err)
		}
	}
	// The cap of all calls is reached: refused as such, watch or not.
	_, err = c.Take(a, "/other")
	if !errors.As(err, &r) || r.Method != "" || r.Max != 5 {
		t.Fatalf("a call past the cap of 5: %v, want refused past the source's cap", err)
	}
	releases[0]()
	releases[0]()
	if got := c.HeldOf(a, watch); got != 1 {
		t.Fatalf("watches held %d after one ended (released twice), want 1", got)
	}
	if _, err := c.Take(a, watch); err != nil {
		t.Fatalf("a watch after one ended: %v", err)
	}
}
