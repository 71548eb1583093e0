package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestTransient(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, "down"), true},
		{status.Error(codes.DeadlineExceeded, "slow"), true},
		{status.Error(codes.ResourceExhausted, "rate limited"), true},
		{fmt.Errorf("wrapped: %w", status.Error(codes.Unavailable, "down")), true},
		{&net.OpError{Op: "dial", Err: errors.New("refused")}, true},
		{context.DeadlineExceeded, true},
		{status.Error(codes.NotFound, "unknown join token"), false},
		{status.Error(codes.FailedPrecondition, "no uses left"), false},
		{status.Error(codes.PermissionDenied, "locked"), false},
		{status.Error(codes.Unauthenticated, ""), false},
		{&refusal{codes.NotFound, ErrTrustBundle}, false},
		{ErrFingerprint, false},
		{&ExpiredError{}, false},
	}
	for _, tt := range tests {
		if got := Transient(tt.err); got != tt.want {
			t.Errorf("Transient(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func shortBackoff(t *testing.T) {
	minB, maxB := backoffMin, backoffMax
	backoffMin, backoffMax = 10*time.Millisecond, 40*time.Millisecond
	t.Cleanup(func() { backoffMin, backoffMax = minB, maxB })
}

// TestRunJoinsAndRenews: an agent with no identity joins with the request
// it is given, renews short-lived certificates at half-life through
// transient failures, and stops cleanly when cancelled.
func TestRunJoinsAndRenews(t *testing.T) {
	shortBackoff(t)
	f := newFakeAuthority(t, fakeOptions{ttl: 2 * time.Second})
	f.mu.Lock()
	f.renewErrs = []error{status.Error(codes.Unavailable, "down"), status.Error(codes.ResourceExhausted, "busy")}
	f.mu.Unlock()
	dir := Dir(t.TempDir())
	m := NewMetrics()
	a := New(Options{Dir: dir, Metrics: m, Timeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func() (JoinRequest, error) { return f.joinRequest("n1"), nil }) }()

	deadline := time.After(15 * time.Second)
	for {
		st, _ := dir.ReadState()
		if st != nil && st.Generation >= 2 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Run ended: %v", err)
		case <-deadline:
			t.Fatalf("no second renewal in 15s; state %+v", st)
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop within 5s of cancel")
	}
	if _, ex, _ := f.calls(); ex != 1 {
		t.Errorf("%d joins, want 1", ex)
	}
	if !dir.HasIdentity() {
		t.Error("the identity is gone")
	}
}

func TestRunStopsOnPermanentFailure(t *testing.T) {
	shortBackoff(t)
	f := newFakeAuthority(t, fakeOptions{ttl: 2 * time.Second})
	_, dir := joined(t, f)
	f.mu.Lock()
	f.renewErrs = []error{status.Error(codes.Unavailable, "down"), status.Error(codes.PermissionDenied, "superseded")}
	f.mu.Unlock()
	before := snapshot(t, dir)
	err := New(Options{Dir: dir}).Run(t.Context(), nil)
	var op *OpError
	if !errors.As(err, &op) || op.Op != "renewal" || codeOf(err) != codes.PermissionDenied {
		t.Fatalf("got %v, want a PERMISSION_DENIED renewal failure", err)
	}
	after := snapshot(t, dir)
	for p, data := range before {
		if p != dir.StateFile() && after[p] != data {
			t.Errorf("%s changed", p)
		}
	}
}

func TestRunRefusesAJoinThatCannotSucceed(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	f.mu.Lock()
	f.exchangeErr = status.Error(codes.NotFound, "unknown join token or wrong secret")
	f.mu.Unlock()
	err := New(Options{Dir: Dir(t.TempDir())}).Run(t.Context(), func() (JoinRequest, error) { return f.joinRequest("n1"), nil })
	if codeOf(err) != codes.NotFound {
		t.Fatalf("got %v, want NOT_FOUND", err)
	}
	if err := New(Options{Dir: Dir(t.TempDir())}).Run(t.Context(), func() (JoinRequest, error) {
		return JoinRequest{}, errors.New("no join token")
	}); err == nil {
		t.Fatal("Run without identity or token succeeded")
	}
}

func TestRunExpired(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	st, _ := dir.ReadState()
	err := New(Options{Dir: dir, Now: func() time.Time { return st.NotAfter }}).Run(t.Context(), nil)
	var exp *ExpiredError
	if !errors.As(err, &exp) {
		t.Fatalf("got %v, want ExpiredError", err)
	}
}

func TestRenewAt(t *testing.T) {
	a := New(Options{})
	f := newFakeAuthority(t, fakeOptions{ttl: 24 * time.Hour})
	_, dir := joined(t, f)
	id, _ := dir.LoadIdentity()
	leaf := id.Leaf()
	// Counted from when the agent got the certificate, not the backdated
	// NotBefore.
	got := leaf.NotBefore.Add(time.Minute)
	st := &State{Serial: serialOf(leaf), JoinedAt: got}
	half := leaf.NotAfter.Sub(got) / 2
	for range 100 {
		at := a.renewAt(st, leaf)
		if d := at.Sub(got); d < half*9/10-time.Second || d > half*11/10+time.Second {
			t.Fatalf("renewal at %v after getting the certificate, want %v ± 10%%", d, half)
		}
	}
}

// TestRetryableBound: a bound-keypair agent retries a spent recovery
// budget (an operator may raise it) besides transient failures, and
// nothing else.
func TestRetryableBound(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"unavailable", status.Error(codes.Unavailable, "down"), true},
		{"recovery_exhausted", status.Error(codes.FailedPrecondition, "recovery_exhausted: raise the limit"), true},
		{"recovery_exhausted wrapped", &OpError{Op: "recovery", Err: status.Error(codes.FailedPrecondition, "recovery_exhausted")}, true},
		{"registration_closed", status.Error(codes.FailedPrecondition, "registration_closed"), false},
		{"join_state_mismatch", status.Error(codes.PermissionDenied, "join_state_mismatch"), false},
		{"locked", status.Error(codes.PermissionDenied, "locked"), false},
		{"challenge_failed", status.Error(codes.Unauthenticated, "challenge_failed"), false},
		{"local", errors.New("recovery_exhausted"), false},
	}
	for _, tt := range tests {
		if got := retryableBound(tt.err); got != tt.want {
			t.Errorf("%s: retryableBound = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestRetryWait: the backoff is jittered within [delay/2, delay], cut to
// end at the certificate's expiry while one is ahead, and whole again once
// it has passed (never zero: that was a busy loop).
func TestRetryWait(t *testing.T) {
	const delay = 8 * time.Second
	for _, tc := range []struct {
		name     string
		expires  bool
		left     time.Duration
		min, max time.Duration
	}{
		{"no expiry", false, 0, delay / 2, delay},
		{"expiry far ahead", true, time.Hour, delay / 2, delay},
		{"expiry sooner than the backoff", true, time.Second, time.Second, time.Second},
		{"expired just now", true, 0, delay / 2, delay},
		{"expired long ago", true, -time.Hour, delay / 2, delay},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 1000 {
				if w := retryWait(delay, tc.expires, tc.left); w < tc.min || w > tc.max {
					t.Fatalf("retryWait(%s, %v, %s) = %s, want within [%s, %s]", delay, tc.expires, tc.left, w, tc.min, tc.max)
				}
			}
		})
	}
}

// TestRetryPastExpiryBacksOff: a renewal retried through an unreachable
// authority past its certificate's expiry (a bound-keypair agent keeps
// trying, to recover) waits with backoff between attempts rather than
// retrying at once: over three seconds with a 100 ms minimum it makes a
// handful of attempts, not thousands.
func TestRetryPastExpiryBacksOff(t *testing.T) {
	minB := backoffMin
	backoffMin = 100 * time.Millisecond
	t.Cleanup(func() { backoffMin = minB })
	a := newTestAgent(t, Dir(t.TempDir()))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	attempts := 0
	err := a.retry(ctx, "renewal", time.Now().Add(200*time.Millisecond), func() error {
		attempts++
		return status.Error(codes.Unavailable, "the authority is unreachable")
	})
	if ctx.Err() == nil {
		t.Fatalf("retry ended before its context: %v", err)
	}
	// Waits of at least 50, 100, 200, 400, 800 ms, 1.6 s (the first cut
	// to the expiry): seven attempts at most fit in three seconds.
	if attempts < 2 || attempts > 8 {
		t.Fatalf("%d attempts in 3s, want a few (backoff from 100 ms)", attempts)
	}
}
