// Package retrywait spaces out the retries of an action that keeps
// failing for one key (a key destruction while its token is away): each
// failure doubles the wait before the next try, up to a cap, so an outage
// of a day costs a few hundred tries, not one per clock pass.
package retrywait

import (
	"sync"
	"time"
)

// Waits holds, by key, when a failed action may be tried again and how
// long the wait before it was. Times are the caller's clock (a store
// clock, so a failover keeps the schedule meaningful). Safe for concurrent
// use; with First and Max zero (the zero value) a failure makes no wait.
type Waits struct {
	First, Max time.Duration

	mu   sync.Mutex
	next map[string]wait
}

type wait struct {
	at  time.Time
	len time.Duration
}

// Due reports whether key may be tried at now: never failed, or its wait
// has passed. A wait that ends further ahead than its length (the clock
// stepped back, a failover to a server whose clock is behind) has passed
// too, so a clock step never blocks the retries.
func (w *Waits) Due(key string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.next[key]
	return !ok || !now.Before(r.at) || r.at.Sub(now) > r.len
}

// Tried records how the try of key at now went: a failure doubles the
// wait (from First, up to Max), a success forgets key.
func (w *Waits) Tried(key string, now time.Time, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		delete(w.next, key)
		return
	}
	l := w.First
	if r, ok := w.next[key]; ok {
		l = min(2*r.len, w.Max)
	}
	if w.next == nil {
		w.next = map[string]wait{}
	}
	w.next[key] = wait{at: now.Add(l), len: l}
}

// Keep forgets the keys not in pending: their action is no longer needed
// (done by another replica perhaps), so memory stays bounded by what is
// pending.
func (w *Waits) Keep(pending map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.next {
		if !pending[k] {
			delete(w.next, k)
		}
	}
}
