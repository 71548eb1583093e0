package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// lockedUntil is the authority's refusal for a lock that ends after left.
func lockedUntil(left time.Duration) error {
	now := time.Now()
	return errinfo.ErrorUntil(codes.PermissionDenied, "locked", "locked", now.Add(left), now)
}

// TestLockedWait: a refusal for a lock is waited out — until the end the
// authority names, at most lockedRecheck, which is also the wait for a
// lock without a TTL — never less than backoffMin, plus a bounded jitter;
// any other refusal is not a lock's.
func TestLockedWait(t *testing.T) {
	permanent := errinfo.Error(codes.PermissionDenied, "locked", "locked")
	tests := []struct {
		name     string
		err      error
		locked   bool
		min, max time.Duration
	}{
		{"lock with a TTL", lockedUntil(90 * time.Second), true, 90 * time.Second, 99 * time.Second},
		{"short lock", lockedUntil(3 * time.Second), true, 3 * time.Second, 4 * time.Second},
		{"lock ending now", lockedUntil(0), true, backoffMin, backoffMin + time.Second},
		{"lock with a long TTL", lockedUntil(48 * time.Hour), true, lockedRecheck, lockedRecheck + lockedJitterMax},
		{"lock without a TTL", permanent, true, lockedRecheck, lockedRecheck + lockedJitterMax},
		{"wrapped, with the hint", &OpError{Op: "renewal", Err: withHint(lockedUntil(time.Minute), "muster lock list names it")}, true, time.Minute, time.Minute + 6*time.Second},
		{"superseded", errinfo.Error(codes.PermissionDenied, "superseded", "superseded"), false, 0, 0},
		{"locked, another code", errinfo.Error(codes.FailedPrecondition, "locked", "locked"), false, 0, 0},
		{"no reason", status.Error(codes.PermissionDenied, "locked"), false, 0, 0},
		{"unavailable", status.Error(codes.Unavailable, "down"), false, 0, 0},
		{"not a status", errors.New("locked"), false, 0, 0},
	}
	for _, tt := range tests {
		for range 200 {
			w, locked := lockedWait(tt.err, backoffMin)
			if locked != tt.locked || w < tt.min || w > tt.max {
				t.Fatalf("%s: lockedWait = %s, %v; want within [%s, %s], %v", tt.name, w, locked, tt.min, tt.max, tt.locked)
			}
		}
	}
}

// TestLockRefusal: a refusal for a lock is read once for what retryIf
// needs of it: when the lock ends, as the authority says (none for a lock
// without a TTL), and the least wait after the next refusal, which
// doubles (up to backoffMax) while the authority says the lock has ended
// sooner than the current least wait, and starts again from backoffMin
// otherwise; any other refusal is not a lock's.
func TestLockRefusal(t *testing.T) {
	permanent := errinfo.Error(codes.PermissionDenied, "locked", "locked")
	tests := []struct {
		name          string
		err           error
		locked        bool
		ends          time.Duration
		hasEnd        bool
		floor, nextFl time.Duration
	}{
		{"lock with a TTL", lockedUntil(90 * time.Second), true, 90 * time.Second, true, backoffMin, backoffMin},
		{"lock ending now", lockedUntil(0), true, 0, true, backoffMin, 2 * backoffMin},
		{"lock ended, floor high", lockedUntil(0), true, 0, true, backoffMax, backoffMax},
		{"lock ending before the floor", lockedUntil(time.Second), true, time.Second, true, 4 * time.Second, 8 * time.Second},
		{"lock ending at the floor", lockedUntil(4 * time.Second), true, 4 * time.Second, true, 4 * time.Second, backoffMin},
		{"lock without a TTL", permanent, true, 0, false, 8 * time.Second, backoffMin},
		{"wrapped, with the hint", &OpError{Op: "renewal", Err: withHint(lockedUntil(time.Minute), "muster lock list names it")}, true, time.Minute, true, backoffMin, backoffMin},
		{"superseded", errinfo.Error(codes.PermissionDenied, "superseded", "superseded"), false, 0, false, 0, 0},
		{"locked, another code", errinfo.Error(codes.FailedPrecondition, "locked", "locked"), false, 0, false, 0, 0},
		{"not a status", errors.New("locked"), false, 0, false, 0, 0},
	}
	for _, tt := range tests {
		l, locked := lockRefusalOf(tt.err)
		if locked != tt.locked || l.ends != tt.ends || l.hasEnd != tt.hasEnd {
			t.Errorf("%s: lockRefusalOf = %+v, %v; want ends %s (%v), %v", tt.name, l, locked, tt.ends, tt.hasEnd, tt.locked)
			continue
		}
		if !locked {
			continue
		}
		if got := l.nextFloor(tt.floor); got != tt.nextFl {
			t.Errorf("%s: nextFloor(%s) = %s, want %s", tt.name, tt.floor, got, tt.nextFl)
		}
		if w, lw := l.wait(tt.floor), lockedRecheck+lockedJitterMax; w < min(tt.floor, lockedRecheck) || w > lw {
			t.Errorf("%s: wait(%s) = %s, want within [%s, %s]", tt.name, tt.floor, w, min(tt.floor, lockedRecheck), lw)
		}
	}
}

// TestRunWaitsOutALock: a renewal refused for a lock does not stop the
// agent: it waits (until the lock's end, or lockedRecheck for a lock
// without a TTL) and asks again, and renews once the lock is gone.
func TestRunWaitsOutALock(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"lock with a TTL", lockedUntil(50 * time.Millisecond)},
		{"lock without a TTL", errinfo.Error(codes.PermissionDenied, "locked", "locked")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shortBackoff(t)
			recheck := lockedRecheck
			lockedRecheck = 100 * time.Millisecond
			t.Cleanup(func() { lockedRecheck = recheck })
			f := newFakeAuthority(t, fakeOptions{ttl: time.Hour})
			_, dir := joined(t, f)
			f.mu.Lock()
			f.renewErrs = []error{tc.err, tc.err}
			f.mu.Unlock()
			st, err := dir.ReadState()
			if err != nil {
				t.Fatal(err)
			}
			clock := &testClock{}
			clock.set(st.NotAfter.Add(-10 * time.Minute)) // due, not expired
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				done <- New(Options{Dir: dir, Now: clock.Now}).Run(ctx, nil)
			}()
			t.Cleanup(func() { cancel(); <-stopped })
			waitFor(t, done, "the renewal after the lock", func() bool {
				st, _ := dir.ReadState()
				return st != nil && st.Generation >= 1
			})
			if _, _, n := f.calls(); n != 3 {
				t.Errorf("%d renewal requests, want 3 (two refused for the lock, then one renewed)", n)
			}
		})
	}
}

// TestRunLockedPastExpiry: an agent locked past its certificate's expiry
// makes its last attempts while the certificate is valid, then stops with
// the expiry (and the join that works), instead of waiting on.
func TestRunLockedPastExpiry(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{ttl: time.Hour})
	var locks []error
	for range 100 {
		locks = append(locks, lockedUntil(time.Hour))
	}
	// The expiry is set close once the first request has arrived, not
	// before the agent starts: the time a loaded -race CI takes to start
	// it and send the request (seconds) is not counted against it. What
	// is left still covers the refusal's way back.
	err := runRenewalHeldUntil(t, f, locks, -5*time.Second)
	var exp *ExpiredError
	if !errors.As(err, &exp) {
		t.Fatalf("got %v, want ExpiredError", err)
	}
	if _, _, n := f.calls(); n < 2 {
		t.Errorf("%d renewal requests, want the last ones made before the expiry", n)
	}
}

// TestRunLockedRefusalAfterExpiry: a refusal for a lock that arrives after
// the certificate has expired (the request sent just before the expiry,
// or answered late) stops the agent with the expiry at once, as the
// attempt after any other refusal does, instead of waiting the lock out
// (up to lockedRecheck) with its expiry unreported.
func TestRunLockedRefusalAfterExpiry(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{ttl: time.Hour})
	// Expired while the request is out.
	err := runRenewalHeldUntil(t, f, []error{lockedUntil(time.Hour)}, time.Second)
	var exp *ExpiredError
	if !errors.As(err, &exp) {
		t.Fatalf("got %v, want ExpiredError at once (not after the lock's wait)", err)
	}
	if _, _, n := f.calls(); n != 1 {
		t.Errorf("%d renewal requests, want 1: the expired certificate is not presented", n)
	}
}

// runRenewalHeldUntil joins an agent to f and runs it with its clock due
// (10 minutes before expiry) but not expired, f refusing its renewals with
// errs. f holds the first renewal request until the agent's clock is set
// to the certificate's expiry plus late; Run's result is returned.
func runRenewalHeldUntil(t *testing.T, f *fakeAuthority, errs []error, late time.Duration) error {
	t.Helper()
	_, dir := joined(t, f)
	f.mu.Lock()
	f.renewErrs = errs
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	f.renewHold, f.renewHeld = hold, held
	f.mu.Unlock()
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	clock := &testClock{}
	clock.set(st.NotAfter.Add(-10 * time.Minute)) // due, not expired
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- New(Options{Dir: dir, Now: clock.Now}).Run(ctx, nil) }()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the agent stopped before renewing: %v", err)
	}
	clock.set(st.NotAfter.Add(late))
	close(hold)
	return <-done
}

// syncBuffer is a bytes.Buffer for a logger written from several
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStreamWaitsOutALock: a stream refused for a lock waits as the
// renewal does (until the lock's end, or lockedRecheck without a TTL)
// before it reconnects, instead of knocking at its backoff of seconds.
func TestStreamWaitsOutALock(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		min  time.Duration
	}{
		{"lock with a TTL", lockedUntil(time.Hour), 59 * time.Minute},
		{"lock without a TTL", errinfo.Error(codes.PermissionDenied, "locked", "locked"), 10000 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			minB, maxB, recheck := streamBackoffMin, streamBackoffMax, lockedRecheck
			t.Cleanup(func() { streamBackoffMin, streamBackoffMax, lockedRecheck = minB, maxB, recheck })
			streamBackoffMin, streamBackoffMax, lockedRecheck = time.Millisecond, time.Millisecond, 10000*time.Hour
			f := newFakeAuthority(t, fakeOptions{})
			_, dir := joined(t, f)
			f.mu.Lock()
			f.connect = func(musterv1.AgentService_ConnectServer) error { return tc.err }
			f.mu.Unlock()
			var logs syncBuffer
			a := New(Options{Dir: dir, Timeout: 5 * time.Second, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); a.keepStream(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			const msg = "stream to the authority closed: refused for the node's standing"
			var rec struct {
				Msg     string `json:"msg"`
				RetryIn string `json:"retry_in"`
			}
			waitFor(t, nil, "the stream's refusal", func() bool {
				for _, line := range strings.Split(logs.String(), "\n") {
					if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg {
						return true
					}
				}
				return false
			})
			if got, err := time.ParseDuration(rec.RetryIn); err != nil || got < tc.min {
				t.Errorf("the stream reconnects in %q, want at least %s", rec.RetryIn, tc.min)
			}
		})
	}
}

// TestRunLockEndedButStillRefusedBacksOff: a lock the authority says has
// ended (RetryInfo 0) but still refuses — the store's clock, which decides,
// behind the authority's — is asked about with a wait that doubles with
// each such refusal, up to backoffMax, not every backoffMin (a second)
// for as long as the clocks disagree, each refusal audited; a refusal for
// a lock that ends later starts the floor again.
func TestRunLockEndedButStillRefusedBacksOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		errs []error
		want func() []time.Duration
	}{
		{"ended, still refused", []error{lockedUntil(0), lockedUntil(0), lockedUntil(0), lockedUntil(0), lockedUntil(0)},
			func() []time.Duration {
				return []time.Duration{backoffMin, 2 * backoffMin, backoffMax, backoffMax, backoffMax}
			}},
		{"a lock that ends later", []error{lockedUntil(0), lockedUntil(0), lockedUntil(time.Hour), lockedUntil(0)},
			func() []time.Duration { return []time.Duration{backoffMin, 2 * backoffMin, lockedRecheck, backoffMin} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shortBackoff(t)
			jitter, recheck := lockedJitterMax, lockedRecheck
			lockedJitterMax = time.Nanosecond // the waits as computed, not drawn
			lockedRecheck = 60 * time.Millisecond
			t.Cleanup(func() { lockedJitterMax, lockedRecheck = jitter, recheck })
			dir, _, _, logs, done := runRefusedRenewal(t, tc.errs)
			waitFor(t, done, "the renewal after the refusals", func() bool {
				st, _ := dir.ReadState()
				return st != nil && st.Generation >= 1
			})
			var waits []time.Duration
			for _, line := range strings.Split(logs.String(), "\n") {
				var rec struct {
					Msg     string `json:"msg"`
					RetryIn string `json:"retry_in"`
				}
				if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "renewal refused: locked; asking again" {
					continue
				}
				d, err := time.ParseDuration(rec.RetryIn)
				if err != nil {
					t.Fatalf("retry_in %q: %v", rec.RetryIn, err)
				}
				waits = append(waits, d)
			}
			if want := tc.want(); !slices.Equal(waits, want) {
				t.Errorf("waits after the refusals %v, want %v", waits, want)
			}
		})
	}
}

// TestRunLockWaitNoticesASuspend: an agent waiting out a lock whose
// machine is suspended past its certificate's expiry (its clock jumps
// ahead; a timer does not count the suspend) makes the attempt that
// reports the expiry within maxSleep of waking, instead of waiting out
// the rest of the interval (up to 15 minutes) first.
func TestRunLockWaitNoticesASuspend(t *testing.T) {
	shortBackoff(t)
	recheck := lockedRecheck
	lockedRecheck = 10000 * time.Hour
	t.Cleanup(func() { lockedRecheck = recheck })
	_, st, clock, logs, done := runRefusedRenewal(t, []error{errinfo.Error(codes.PermissionDenied, "locked", "locked")})
	waitFor(t, done, "the renewal refused for the lock", func() bool {
		return strings.Contains(logs.String(), "renewal refused: locked; asking again")
	})
	// The wait is cut to end 5 s before the expiry, 10 minutes on: the
	// machine sleeps through it.
	clock.set(st.NotAfter.Add(time.Minute))
	select {
	case err := <-done:
		var exp *ExpiredError
		if !errors.As(err, &exp) {
			t.Fatalf("got %v, want ExpiredError", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the agent, its clock past its certificate's expiry, still waits out the lock a minute later")
	}
}

// TestStreamLockWaitNoticesASuspend: a stream waiting out a lock whose
// machine is suspended past the lock's end (its clock jumps ahead; a timer
// does not count the suspend) reconnects within maxSleep of waking,
// instead of waiting out the rest of the interval (up to 15 minutes).
func TestStreamLockWaitNoticesASuspend(t *testing.T) {
	shortBackoff(t)
	setStreamBackoff(t, time.Millisecond, time.Millisecond)
	f := newFakeAuthority(t, fakeOptions{ttl: 24 * time.Hour})
	_, dir := joined(t, f)
	connects := make(chan struct{}, 16)
	f.mu.Lock()
	f.connect = func(musterv1.AgentService_ConnectServer) error {
		connects <- struct{}{}
		return lockedUntil(time.Hour)
	}
	f.mu.Unlock()
	clock := &testClock{}
	var logs syncBuffer
	a := New(Options{Dir: dir, Timeout: 5 * time.Second, Now: clock.Now, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.keepStream(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, nil, "the stream's refusal", func() bool {
		return strings.Contains(logs.String(), "refused for the node's standing")
	})
	<-connects
	// The stream now waits an hour for the lock's end: the machine sleeps
	// through it.
	clock.set(time.Now().Add(2 * time.Hour))
	select {
	case <-connects:
	case <-time.After(time.Minute):
		t.Fatal("the stream, its clock past the lock's end, still waits a minute later")
	}
}

// runRefusedRenewal runs an agent whose renewal, due (10 minutes before
// expiry on its clock) but not expired, the authority refuses with errs
// first. It returns the agent's directory, its state before the run, its
// clock, its log and the channel Run's result arrives on.
func runRefusedRenewal(t *testing.T, errs []error) (Dir, *State, *testClock, *syncBuffer, <-chan error) {
	t.Helper()
	f := newFakeAuthority(t, fakeOptions{ttl: time.Hour})
	_, dir := joined(t, f)
	f.mu.Lock()
	f.renewErrs = append(f.renewErrs, errs...)
	f.mu.Unlock()
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	clock := &testClock{}
	clock.set(st.NotAfter.Add(-10 * time.Minute)) // due, not expired
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		done <- New(Options{Dir: dir, Now: clock.Now, Log: slog.New(slog.NewJSONHandler(logs, nil))}).Run(ctx, nil)
	}()
	t.Cleanup(func() { cancel(); <-stopped })
	return dir, st, clock, logs, done
}
