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
//
// A method that answers for as long as it is held, and needs no more
// than a few at once from one source, has a Bound of its own within the
// source's cap, counted in the same map: HealthWatches, on the authority
// and on discovery.
package callcap

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

// Bound is a method's own cap within its source's: at most PerSource
// calls of Method from one source at once, each counted against the
// source's cap of all its calls too.
type Bound struct {
	// Method is the full method name, /SERVICE/METHOD.
	Method    string
	PerSource int
}

// HealthWatches bounds the grpc.health.v1.Health/Watch streams of a
// source on the authority and on discovery alike. A watch is anonymous
// and answers for as long as it is held (the authority's for 5 minutes,
// discovery's until its call timeout), so a source at the call cap could
// otherwise hold a thousand of them at once for nothing. A health checker
// watches a service or two; 8 leave room for several behind one address.
var HealthWatches = Bound{Method: healthpb.Health_Watch_FullMethodName, PerSource: 8}

// Refused is the error of a call Take did not let through.
type Refused struct {
	Source netip.Addr
	// Method is the method whose own Bound the call is past; "" when it
	// is past the source's cap of all its calls.
	Method string
	// Max is the bound the source holds already.
	Max int
}

func (r *Refused) Error() string {
	if r.Method != "" {
		return fmt.Sprintf("callcap: %s holds %d calls of %s already, the most one source may", r.Source, r.Max, r.Method)
	}
	return fmt.Sprintf("callcap: %s holds %d calls already, the most one source may", r.Source, r.Max)
}

// Cap counts the calls in flight per source address, and per source and
// method for the methods with a Bound of their own, in one map. Safe for
// concurrent use.
type Cap struct {
	max    int
	bounds map[string]int

	mu   sync.Mutex
	held map[held]int
}

// held keys the counts: a source's calls of method, or of every method
// when method is "".
type held struct {
	src    netip.Addr
	method string
}

// New returns a cap of max calls per source (max <= 0 is
// DefaultPerSource) and of each bound's calls of its method per source.
func New(max int, bounds ...Bound) *Cap {
	if max <= 0 {
		max = DefaultPerSource
	}
	c := &Cap{max: max, bounds: map[string]int{}, held: map[held]int{}}
	for _, b := range bounds {
		c.bounds[b.Method] = b.PerSource
	}
	return c
}

// Max is the calls one source may have in flight.
func (c *Cap) Max() int { return c.max }

// Take counts one more call of method from src, unless src has Max calls
// in flight already, or as many of method as its Bound allows: then the
// error is a *Refused saying which. release gives the place back, once
// however often it is called. A src that is not a valid address (no IP
// peer) is not counted.
func (c *Cap) Take(src netip.Addr, method string) (release func(), err error) {
	if !src.IsValid() {
		return func() {}, nil
	}
	src = src.Unmap()
	all, own := held{src, ""}, held{src, method}
	bound, bounded := c.bounds[method]
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[all] >= c.max {
		return nil, &Refused{Source: src, Max: c.max}
	}
	if bounded && c.held[own] >= bound {
		return nil, &Refused{Source: src, Method: method, Max: bound}
	}
	c.held[all]++
	if bounded {
		c.held[own]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			c.release(all)
			if bounded {
				c.release(own)
			}
		})
	}, nil
}

func (c *Cap) release(k held) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[k]--; c.held[k] <= 0 {
		delete(c.held, k)
	}
}

// Held is how many calls src has in flight.
func (c *Cap) Held(src netip.Addr) int { return c.HeldOf(src, "") }

// HeldOf is how many calls of method src has in flight, counted for a
// method with a Bound of its own ("": every call).
func (c *Cap) HeldOf(src netip.Addr, method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[held{src.Unmap(), method}]
}

// Tap returns a handle for grpc.InTapHandle that counts each call whose
// method counted reports against its source (callinfo.Source) as its
// headers arrive, before its request is read, until the call ends (gRPC
// cancels the call's context then), and then runs next. A call past the
// cap, or past its method's Bound, is answered with refused's error, which
// should be a status (RESOURCE_EXHAUSTED) and is the caller's to audit;
// gRPC writes it before any handler or interceptor runs.
func (c *Cap) Tap(counted func(method string) bool, refused func(ctx context.Context, method string, r *Refused) error, next tap.ServerInHandle) tap.ServerInHandle {
	if next == nil {
		next = func(ctx context.Context, _ *tap.Info) (context.Context, error) { return ctx, nil }
	}
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if !counted(info.FullMethodName) {
			return next(ctx, info)
		}
		release, err := c.Take(callinfo.Source(ctx), info.FullMethodName)
		if err != nil {
			var r *Refused
			errors.As(err, &r)
			return nil, refused(ctx, info.FullMethodName, r)
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
