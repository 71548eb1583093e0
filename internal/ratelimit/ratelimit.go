// Package ratelimit keeps one token bucket per key (a source address, a
// node and source, an authority) for the unauthenticated surfaces of the
// authority and of discovery, and forgets idle keys so an attacker who
// varies keys cannot grow it without bound.
package ratelimit

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Idle is how long an unused key's bucket is kept at least; a bucket that
// takes longer to refill is kept until it would be full.
const Idle = 10 * time.Minute

// Keyed is a set of token buckets, one per key. Safe for concurrent use.
type Keyed struct {
	rate  rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// New returns buckets that refill perSecond and hold at most burst.
func New(perSecond float64, burst int) *Keyed {
	return &Keyed{rate: rate.Limit(perSecond), burst: burst, buckets: map[string]*bucket{}}
}

// Allow takes one token from key's bucket at the default rate.
func (k *Keyed) Allow(key string) bool {
	k.mu.Lock()
	r, b := k.rate, k.burst
	k.mu.Unlock()
	return k.AllowRate(key, r, b)
}

// SetDefault changes the default rate, for buckets new and old (a load
// test lifts it).
func (k *Keyed) SetDefault(perSecond float64, burst int) {
	k.mu.Lock()
	k.rate, k.burst = rate.Limit(perSecond), burst
	k.mu.Unlock()
}

// AllowRate takes one token from key's bucket, which refills at r and holds
// burst: a bucket whose owner changed its rate (a new policy) takes the
// new one and keeps its tokens.
func (k *Keyed) AllowRate(key string, r rate.Limit, burst int) bool {
	now := time.Now()
	k.mu.Lock()
	b := k.buckets[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(r, burst)}
		k.buckets[key] = b
	} else if b.lim.Limit() != r || b.lim.Burst() != burst {
		b.lim.SetLimitAt(now, r)
		b.lim.SetBurstAt(now, burst)
	}
	b.seen = now
	k.mu.Unlock()
	return b.lim.AllowN(now, 1)
}

// Run forgets idle keys until ctx ends.
func (k *Keyed) Run(ctx context.Context) error {
	t := time.NewTicker(Idle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			k.forget(now)
		}
	}
}

func (k *Keyed) forget(now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, b := range k.buckets {
		// A bucket is forgotten only once it would have refilled anyway,
		// so forgetting never hands out a fresh burst early.
		idle := Idle
		if lim := b.lim.Limit(); lim > 0 && lim != rate.Inf {
			idle = max(idle, time.Duration(float64(b.lim.Burst())/float64(lim)*float64(time.Second)))
		}
		// A bucket full again is forgotten at once, however recently it
		// was used: a new one starts full, so nothing is given early,
		// and a key that spends one token in a long refill (a renewal
		// in a day's allowance) is not kept for the whole of it.
		if now.Sub(b.seen) > idle || b.lim.TokensAt(now) >= float64(b.lim.Burst()) {
			delete(k.buckets, key)
		}
	}
}
