package authority

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// The unauthenticated RPCs allow each source a burst of 20 requests and 5
// per second after it: ample for a fleet behind one NAT rebooting at once,
// and it keeps one source from guessing secrets or burning CPU on
// signatures.
const (
	bootstrapRate  = 5
	bootstrapBurst = 20
	// limiterIdle is how long an idle source's bucket is kept.
	limiterIdle = 10 * time.Minute
)

// limiter is a token bucket per source address.
type limiter struct {
	rate  rate.Limit
	burst int

	mu      sync.Mutex
	sources map[string]*source
}

type source struct {
	lim  *rate.Limiter
	seen time.Time
}

func newLimiter(perSecond float64, burst int) *limiter {
	return &limiter{rate: rate.Limit(perSecond), burst: burst, sources: map[string]*source{}}
}

// Allow takes one request from source's bucket.
func (l *limiter) Allow(src string) bool {
	now := time.Now()
	l.mu.Lock()
	s := l.sources[src]
	if s == nil {
		s = &source{lim: rate.NewLimiter(l.rate, l.burst)}
		l.sources[src] = s
	}
	s.seen = now
	l.mu.Unlock()
	return s.lim.AllowN(now, 1)
}

// Run forgets idle sources so the map does not grow without bound.
func (l *limiter) Run(ctx context.Context) error {
	t := time.NewTicker(limiterIdle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			l.mu.Lock()
			for k, s := range l.sources {
				if now.Sub(s.seen) > limiterIdle {
					delete(l.sources, k)
				}
			}
			l.mu.Unlock()
		}
	}
}
