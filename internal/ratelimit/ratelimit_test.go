package ratelimit

import (
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestKeyed(t *testing.T) {
	k := New(0.001, 2)
	for i, want := range []bool{true, true, false} {
		if got := k.Allow("a"); got != want {
			t.Errorf("a request %d: allowed %v, want %v", i, got, want)
		}
	}
	if !k.Allow("b") {
		t.Error("another key shares a's bucket")
	}
	// A new rate for the same key applies at once.
	if !k.AllowRate("a", rate.Inf, 1) {
		t.Error("a raised rate was not applied to an existing bucket")
	}
	// a's bucket now refills instantly, b's (2 tokens at 0.001/s) takes
	// 2000 s: after Idle only a is forgotten.
	k.forget(time.Now().Add(Idle + time.Second))
	if _, ok := k.buckets["a"]; ok || len(k.buckets) != 1 {
		t.Errorf("after Idle: buckets %v, want only b", len(k.buckets))
	}
	k.forget(time.Now().Add(2001 * time.Second))
	if len(k.buckets) != 0 {
		t.Errorf("idle buckets kept: %d", len(k.buckets))
	}
}
