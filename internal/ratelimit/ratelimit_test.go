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

// TestForgetFull: a bucket that has refilled is forgotten at the next
// sweep, before its idle time, and one still refilling is kept; a new
// bucket for a forgotten key starts full, so nothing was given early.
func TestForgetFull(t *testing.T) {
	tests := []struct {
		name     string
		perSec   float64
		burst    int
		taken    int
		after    time.Duration
		wantKept bool
	}{
		{"one of ten taken, refilled", 10.0 / 3600, 10, 1, 400 * time.Second, false},
		{"one of ten taken, still refilling", 10.0 / 3600, 10, 1, 300 * time.Second, true},
		{"all taken, half refilled", 10.0 / 3600, 10, 10, 1800 * time.Second, true},
		{"all taken, refilled", 10.0 / 3600, 10, 10, 3601 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := New(1, 1)
			for range tt.taken {
				if !k.AllowRate("a", rate.Limit(tt.perSec), tt.burst) {
					t.Fatal("a token of a full bucket refused")
				}
			}
			k.forget(time.Now().Add(tt.after))
			if _, kept := k.buckets["a"]; kept != tt.wantKept {
				t.Errorf("kept %v after %s, want %v", kept, tt.after, tt.wantKept)
			}
		})
	}
}
