package authority

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/listener"
)

// fakeWatch is a Health/Watch stream that takes every update; sent, if
// set, is told of each.
type fakeWatch struct {
	healthpb.Health_WatchServer
	ctx  context.Context
	sent chan<- struct{}
}

func (f fakeWatch) Context() context.Context { return f.ctx }
func (f fakeWatch) Send(*healthpb.HealthCheckResponse) error {
	if f.sent != nil {
		select {
		case f.sent <- struct{}{}:
		default:
		}
	}
	return nil
}

// fromSource is ctx with a call's peer at ip, as the listener sets it
// (the TCP peer, or the client a trusted proxy's PROXY header names).
func fromSource(ctx context.Context, ip string) context.Context {
	return peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
}

// recordedRefusals keeps the refusals recorded.
type recordedRefusals struct {
	mu     sync.Mutex
	events []audit.Event
}

func (r *recordedRefusals) Record(_ context.Context, e audit.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recordedRefusals) all() []audit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Event(nil), r.events...)
}

func (h *boundedHealth) holding() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// TestHealthWatchBounded: a watch ends after healthWatchFor, so its
// connection can go idle; past maxHealthWatches at once on a listener a
// watch is refused RESOURCE_EXHAUSTED and audited.
func TestHealthWatchBounded(t *testing.T) {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	refusals := &recordedRefusals{}
	h := newBoundedHealth(hs, refusals)

	defer func(d time.Duration) { healthWatchFor = d }(healthWatchFor)
	healthWatchFor = 100 * time.Millisecond
	start := time.Now()
	if err := h.Watch(&healthpb.HealthCheckRequest{}, fakeWatch{ctx: fromSource(t.Context(), "192.0.2.1")}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a watch past its time: %v, want DEADLINE_EXCEEDED", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the watch lasted %s", d)
	}

	healthWatchFor = time.Hour
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	hold := func(src string, n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.Watch(&healthpb.HealthCheckRequest{}, fakeWatch{ctx: fromSource(ctx, src)})
			}()
		}
	}
	waitHeld := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for h.holding() < n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := h.holding(); got != n {
			t.Fatalf("%d watches held, want %d", got, n)
		}
	}
	// refused checks that a watch from src is refused RESOURCE_EXHAUSTED
	// and audited with why: a watch that is served instead fails the test
	// at its first update, rather than waiting for its end.
	refused := func(src, why string) {
		t.Helper()
		wctx, wcancel := context.WithCancel(fromSource(t.Context(), src))
		defer wcancel()
		sent := make(chan struct{}, 1)
		done := make(chan error, 1)
		go func() { done <- h.Watch(&healthpb.HealthCheckRequest{}, fakeWatch{ctx: wctx, sent: sent}) }()
		select {
		case err := <-done:
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("a watch from %s past the bound: %v, want RESOURCE_EXHAUSTED", src, err)
			}
		case <-sent:
			wcancel()
			<-done
			t.Fatalf("a watch from %s past the bound was served", src)
		}
		evs := refusals.all()
		if len(evs) == 0 {
			t.Fatalf("the refused watch from %s was not audited", src)
		}
		e := evs[len(evs)-1]
		if e.Source != src || e.Target != healthpb.Health_Watch_FullMethodName || e.Result != audit.ResultDenied || !strings.Contains(e.Reason, why) {
			t.Errorf("the refusal audited: %+v; want source %s, a reason saying %q", e, src, why)
		}
	}

	// Sources each within their share (callcap.HealthWatches, counted by
	// callTap: e2e TestHealthWatchesPerSourceBehindTrustedProxy) fill the
	// listener.
	for i := range maxHealthWatches {
		hold(fmt.Sprintf("198.51.100.%d", i/4+1), 1)
	}
	waitHeld(maxHealthWatches)
	refused("203.0.113.9", "this listener holds")

	cancel()
	wg.Wait()
	if n := h.holding(); n != 0 {
		t.Errorf("%d watch places held after every watch ended", n)
	}
}

// TestConnShares: anonymous connections take at most 3/4 of the cap, one
// agent identity at most connsPerAgent, operators any; a release gives the
// place back once.
func TestConnShares(t *testing.T) {
	c := newConnShares(8)
	var anon []func()
	for range 6 {
		r, _, ok := c.take(false, "")
		if !ok {
			t.Fatal("an anonymous connection within the share was refused")
		}
		anon = append(anon, r)
	}
	if _, why, ok := c.take(false, ""); ok || why != listener.RefusedAnonymous {
		t.Fatalf("the 7th anonymous connection of a cap of 8: %v %q", ok, why)
	}
	anon[0]()
	anon[0]() // once
	if _, _, ok := c.take(false, ""); !ok {
		t.Fatal("a released anonymous place was not taken again")
	}
	if _, why, ok := c.take(false, ""); ok || why != listener.RefusedAnonymous {
		t.Fatal("a release counted twice")
	}
	for range connsPerAgent {
		if _, _, ok := c.take(false, "n1"); !ok {
			t.Fatal("an agent connection within its share was refused")
		}
	}
	if _, why, ok := c.take(false, "n1"); ok || why != listener.RefusedIdentity {
		t.Fatalf("agent n1 past its share: %v %q", ok, why)
	}
	if _, _, ok := c.take(false, "n2"); !ok {
		t.Fatal("another agent was refused")
	}
	for range 20 {
		if _, _, ok := c.take(true, ""); !ok {
			t.Fatal("an operator was refused")
		}
	}
}
