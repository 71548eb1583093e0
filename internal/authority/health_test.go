package authority

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/listener"
)

// fakeWatch is a Health/Watch stream that takes every update.
type fakeWatch struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (f fakeWatch) Context() context.Context                 { return f.ctx }
func (f fakeWatch) Send(*healthpb.HealthCheckResponse) error { return nil }

// TestHealthWatchBounded: a watch ends after healthWatchFor, so its
// connection can go idle; past maxHealthWatches at once a watch is refused.
func TestHealthWatchBounded(t *testing.T) {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h := newBoundedHealth(hs)

	defer func(d time.Duration) { healthWatchFor = d }(healthWatchFor)
	healthWatchFor = 100 * time.Millisecond
	start := time.Now()
	if err := h.Watch(&healthpb.HealthCheckRequest{}, fakeWatch{ctx: t.Context()}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a watch past its time: %v, want DEADLINE_EXCEEDED", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the watch lasted %s", d)
	}

	healthWatchFor = time.Hour
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range maxHealthWatches {
		wg.Add(1)
		go func() { defer wg.Done(); h.Watch(&healthpb.HealthCheckRequest{}, fakeWatch{ctx: ctx}) }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(h.slots) < maxHealthWatches && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := h.Watch(&healthpb.HealthCheckRequest{}, fakeWatch{ctx: t.Context()}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a watch past the bound: %v, want RESOURCE_EXHAUSTED", err)
	}
	cancel()
	wg.Wait()
	if len(h.slots) != 0 {
		t.Errorf("%d watch places held after every watch ended", len(h.slots))
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
