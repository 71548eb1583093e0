package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
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
	minB, maxB, maxS := backoffMin, backoffMax, maxSleep
	backoffMin, backoffMax, maxSleep = 10*time.Millisecond, 40*time.Millisecond, 5*time.Millisecond
	t.Cleanup(func() { backoffMin, backoffMax, maxSleep = minB, maxB, maxS })
}

// testClock is the wall clock moved forward by an offset the test sets,
// for Options.Now. The agent's schedule follows it, so a test moves it
// past a renewal's due time instead of waiting for short-lived
// certificates to age, while TLS, which reads the wall clock, still
// accepts the certificates (they live an hour). It counts its readings,
// so a test can tell the agent has looked at it.
type testClock struct {
	mu     sync.Mutex
	offset time.Duration
	reads  int
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return time.Now().Add(c.offset)
}

// set moves the clock to read at now, and returns how often it had been
// read.
func (c *testClock) set(at time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset = time.Until(at)
	return c.reads
}

func (c *testClock) readings() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

// waitFor polls until cond holds, failing if Run ends first or nothing
// happens within a minute (a hang, not a slow machine).
func waitFor(t *testing.T, done <-chan error, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !cond() {
		select {
		case err := <-done:
			t.Fatalf("Run ended waiting for %s: %v", what, err)
		case <-deadline:
			t.Fatalf("no %s within a minute", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestRunJoinsAndRenews: an agent with no identity joins with the request
// it is given, renews at about half of each certificate's lifetime (not
// before 45% of it) through transient failures, and stops cleanly when
// cancelled. The agent's clock is moved by the test, not waited for.
func TestRunJoinsAndRenews(t *testing.T) {
	shortBackoff(t)
	f := newFakeAuthority(t, fakeOptions{ttl: time.Hour})
	f.mu.Lock()
	f.renewErrs = []error{status.Error(codes.Unavailable, "down"), status.Error(codes.ResourceExhausted, "busy")}
	f.mu.Unlock()
	dir := Dir(t.TempDir())
	m := NewMetrics()
	clock := &testClock{}
	a := New(Options{Dir: dir, Metrics: m, Now: clock.Now, Timeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		done <- a.Run(ctx, func() (JoinRequest, error) { return f.joinRequest("n1"), nil })
	}()
	// A failed test stops Run before shortBackoff's cleanup restores
	// the variables it reads.
	t.Cleanup(func() { cancel(); <-stopped })

	var st *State
	waitFor(t, done, "join", func() bool { st, _ = dir.ReadState(); return st != nil })
	wantRenewals := 0
	for gen := int64(1); gen <= 2; gen++ {
		got := st.JoinedAt
		if st.LastRenewal != nil {
			got = *st.LastRenewal
		}
		half := st.NotAfter.Sub(got) / 2
		// Short of the earliest due time (half - 10% jitter): the agent
		// looks at the clock, many times, and does not renew.
		seen := clock.set(got.Add(half * 8 / 10))
		waitFor(t, done, "look at the clock", func() bool { return clock.readings() >= seen+20 })
		if _, _, n := f.calls(); n != wantRenewals {
			t.Fatalf("generation %d: %d renewal requests at 40%% of the lifetime, want %d", gen-1, n, wantRenewals)
		}
		// Past the latest (half + 10%), well before expiry: it renews.
		clock.set(got.Add(half * 12 / 10))
		waitFor(t, done, fmt.Sprintf("generation %d", gen), func() bool {
			st, _ = dir.ReadState()
			return st != nil && st.Generation >= gen
		})
		wantRenewals++
		if gen == 1 {
			wantRenewals += 2 // the transient failures, retried
		}
		if _, _, n := f.calls(); n != wantRenewals {
			t.Errorf("generation %d after %d renewal requests, want %d", gen, n, wantRenewals)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not stop within a minute of cancel")
	}
	if _, ex, _ := f.calls(); ex != 1 {
		t.Errorf("%d joins, want 1", ex)
	}
	if !dir.HasIdentity() {
		t.Error("the identity is gone")
	}
}

// TestRunStopsOnPermanentFailure: a due renewal that fails transiently is
// retried, and one that fails permanently ends Run with its error,
// leaving the identity as it was.
func TestRunStopsOnPermanentFailure(t *testing.T) {
	shortBackoff(t)
	f := newFakeAuthority(t, fakeOptions{ttl: time.Hour})
	_, dir := joined(t, f)
	f.mu.Lock()
	f.renewErrs = []error{status.Error(codes.Unavailable, "down"), status.Error(codes.PermissionDenied, "superseded")}
	f.mu.Unlock()
	before := snapshot(t, dir)
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	// Due (past half of the lifetime and its jitter), not expired.
	clock := &testClock{}
	clock.set(st.NotAfter.Add(-10 * time.Minute))
	// A Run that does not stop (the refusal retried) ends with the
	// context, and nil, failing below rather than hanging.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err = New(Options{Dir: dir, Now: clock.Now}).Run(ctx, nil)
	var op *OpError
	if !errors.As(err, &op) || op.Op != "renewal" || codeOf(err) != codes.PermissionDenied {
		t.Fatalf("got %v, want a PERMISSION_DENIED renewal failure", err)
	}
	if _, _, n := f.calls(); n != 2 {
		t.Errorf("%d renewal requests, want 2 (the transient failure retried)", n)
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
	// The line agent run ends with names the join that works, for this
	// directory and node (a PSK agent's own join would find its node taken).
	want := "muster agent join --force --data " + string(dir) + " --node n1 with a joining URI from muster token create --node n1"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("got %q, want it to name %q", err, want)
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
		// The ErrorInfo reason decides, not the message's words: an
		// authority that says it in other words is still retried, and
		// another refusal quoting them is not.
		{"reason recovery_exhausted", errinfo.Error(codes.FailedPrecondition, "the token's recovery budget is spent", "recovery_exhausted"), true},
		{"reason recovery_exhausted wrapped", &OpError{Op: "recovery", Err: errinfo.Error(codes.FailedPrecondition, "budget spent", "recovery_exhausted")}, true},
		{"reason registration_closed quoting recovery_exhausted", errinfo.Error(codes.FailedPrecondition, "registration_closed: token bot-1 (its last refusal: recovery_exhausted)", "registration_closed"), false},
		{"reason recovery_exhausted, another code", errinfo.Error(codes.PermissionDenied, "recovery_exhausted", "recovery_exhausted"), false},
		{"no reason, the word quoted later", status.Error(codes.FailedPrecondition, "registration_closed: after recovery_exhausted"), false},
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
		{"expiry within the minimum backoff", true, time.Second, time.Second, time.Second},
		// A wait that would reach the expiry ends before it, so the
		// attempt after it can still renew (it ended at the expiry, where
		// the attempt found the certificate expired and gave up).
		{"expiry sooner than the backoff", true, 4 * time.Second, 2 * time.Second, 2 * time.Second},
		{"expiry within the backoff's range", true, 6 * time.Second, 3 * time.Second, 6*time.Second - 1},
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
