// Package callcap bounds the calls one source address has in flight at
// once on a server. Each call is bounded in time (calldeadline) and each
// connection in calls (100), but not a source: one address could open
// 100 calls on each of its 256 connections and send none of their
// requests, about 300 MiB of the server's memory for the call timeout,
// and open new ones as the old ended. Counting the calls each source has
// in flight, from their headers to their end, and refusing one past the
// cap before any handler runs, keeps one source from holding the capacity
// the others need.
//
// What is counted is concurrency, not a rate: a call of muster's own
// clients lasts milliseconds, so even thousands of agents behind one NAT
// address hold a handful of calls at a time, while calls held open are
// what a flood from one source is made of.
package callcap

import (
	"context"
	"net/netip"
	"sync"

	"google.golang.org/grpc/tap"

	"github.com/muster-dev/muster/internal/callinfo"
)

// DefaultPerSource is the cap by default: four calls in flight on each of
// the 256 connections one source may hold (listener.MaxConnsPerSource),
// where a call of muster's own clients holds one for milliseconds: a fleet
// behind one address making 1,000 calls a second of 10 ms each holds 10.
// A source at the cap holds about 12 MiB of calls whose request never
// comes (12 KiB each, docs/threat-model.md), about what its idle
// connections cost, not the 300 MiB it could before.
const DefaultPerSource = 1024

// Cap counts the calls in flight per source address. Safe for concurrent
// use.
type Cap struct {
	max int

	mu   sync.Mutex
	held map[netip.Addr]int
}

// New returns a cap of max calls per source; max <= 0 is
// DefaultPerSource.
func New(max int) *Cap {
	if max <= 0 {
		max = DefaultPerSource
	}
	return &Cap{max: max, held: map[netip.Addr]int{}}
}

// Max is the calls one source may have in flight.
func (c *Cap) Max() int { return c.max }

// Take counts one more call from src, unless src has Max in flight
// already; release gives the place back, once however often it is
// called. A src that is not a valid address (no IP peer) is not counted.
func (c *Cap) Take(src netip.Addr) (release func(), ok bool) {
	if !src.IsValid() {
		return func() {}, true
	}
	src = src.Unmap()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[src] >= c.max {
		return nil, false
	}
	c.held[src]++
	var once sync.Once
	return func() { once.Do(func() { c.release(src) }) }, true
}

func (c *Cap) release(src netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[src]--; c.held[src] <= 0 {
		delete(c.held, src)
	}
}

// Held is how many calls src has in flight.
func (c *Cap) Held(src netip.Addr) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[src.Unmap()]
}

// Tap returns a handle for grpc.InTapHandle that counts each call whose
// method counted reports against its source (callinfo.Source) as its
// headers arrive, before its request is read, until the call ends (gRPC
// cancels the call's context then), and then runs next. A call past the
// cap is answered with refused's error, which should be a status
// (RESOURCE_EXHAUSTED) and is the caller's to audit; gRPC writes it
// before any handler or interceptor runs.
func (c *Cap) Tap(counted func(method string) bool, refused func(ctx context.Context, method string) error, next tap.ServerInHandle) tap.ServerInHandle {
	if next == nil {
		next = func(ctx context.Context, _ *tap.Info) (context.Context, error) { return ctx, nil }
	}
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if !counted(info.FullMethodName) {
			return next(ctx, info)
		}
		release, ok := c.Take(callinfo.Source(ctx))
		if !ok {
			return nil, refused(ctx, info.FullMethodName)
		}
		// gRPC cancels a call's context when the call ends, however it
		// ends, once the handles have let it through; not when a later
		// handle refuses it, so that refusal releases here.
		context.AfterFunc(ctx, release)
		out, err := next(ctx, info)
		if err != nil {
			release()
		}
		return out, err
	}
}
