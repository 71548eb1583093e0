package retrywait

import (
	"errors"
	"testing"
	"time"
)

// TestWaitsDoubleUpToTheCap: failures double the wait from First up to
// Max, a success forgets the key, Keep forgets keys no longer pending,
// and a clock stepped back past a wait's length does not block the key.
func TestWaitsDoubleUpToTheCap(t *testing.T) {
	fail := errors.New("token away")
	w := &Waits{First: 5 * time.Second, Max: time.Minute}
	now := time.Unix(1_000_000, 0)
	if !w.Due("k", now) {
		t.Fatal("a key never tried is not due")
	}
	var waits []time.Duration
	for range 6 {
		w.Tried("k", now, fail)
		start := now
		for !w.Due("k", now) {
			now = now.Add(time.Second)
		}
		waits = append(waits, now.Sub(start))
	}
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, time.Minute, time.Minute}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v; want %v", waits, want)
		}
	}
	w.Tried("k", now, fail)
	if w.Due("k", now) {
		t.Fatal("due right after a failure")
	}
	if !w.Due("k", now.Add(-2*time.Minute)) {
		t.Fatal("a clock stepped back past the wait's length blocks the key")
	}
	w.Tried("k", now, nil)
	if !w.Due("k", now) {
		t.Fatal("a success did not forget the key")
	}
	w.Tried("a", now, fail)
	w.Tried("b", now, fail)
	w.Keep(map[string]bool{"b": true})
	if !w.Due("a", now) || w.Due("b", now) {
		t.Fatal("Keep kept a key not pending, or forgot one pending")
	}
}
