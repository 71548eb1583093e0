package agent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// A renewal that succeeds while the stream waits to reconnect ends the
// wait: the authority is back, and the stream (tasks, verifier sets,
// trust bundles) need not wait out a backoff grown while it was down.
// The backoff is kept against a flapping authority: a stream that fails
// again waits the doubled delay, and a renewal that succeeded before the
// stream failed leaves no wake behind.
func TestStreamReconnectsWhenARenewalSucceeds(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, _ := joined(t, f)

	// A wait no test outlives: only a wake ends it.
	minB, maxB, jitter := streamBackoffMin, streamBackoffMax, streamJitter
	t.Cleanup(func() { streamBackoffMin, streamBackoffMax, streamJitter = minB, maxB, jitter })
	streamBackoffMin, streamBackoffMax = 10000*time.Hour, 40000*time.Hour
	type waitDrawn struct {
		delay   time.Duration
		pending bool // a wake was pending as the wait began
	}
	waits := make(chan waitDrawn, 8)
	streamJitter = func(d time.Duration) time.Duration {
		waits <- waitDrawn{d, len(a.streamWake) > 0}
		return d
	}

	// Each stream waits for the test to end it.
	type attempt struct{ end chan error }
	attempts := make(chan attempt)
	f.mu.Lock()
	f.connect = func(stream musterv1.AgentService_ConnectServer) error {
		at := attempt{end: make(chan error, 1)}
		select {
		case attempts <- at:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
		select {
		case err := <-at.end:
			return err
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
	f.mu.Unlock()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.keepStream(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const deadline = 30 * time.Second
	next := func(why string) attempt {
		t.Helper()
		select {
		case at := <-attempts:
			return at
		case <-time.After(deadline):
			t.Fatalf("no stream opened within %s %s", deadline, why)
			return attempt{}
		}
	}
	drawn := func() waitDrawn {
		t.Helper()
		select {
		case w := <-waits:
			return w
		case <-time.After(deadline):
			t.Fatalf("no reconnection wait drawn within %s", deadline)
			return waitDrawn{}
		}
	}
	down := status.Error(codes.Unavailable, "authority down")

	next("at start").end <- down
	if w := drawn(); w.delay != streamBackoffMin || w.pending {
		t.Fatalf("the first wait: delay %s (wake pending %v), want %s", w.delay, w.pending, streamBackoffMin)
	}
	if _, err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	// The authority flaps: the stream fails again.
	next("after a renewal succeeded: the stream still waits out its backoff").end <- down
	if w := drawn(); w.delay != 2*streamBackoffMin || w.pending {
		t.Errorf("the wait after a woken stream failed again: delay %s (wake pending %v), want the doubled %s", w.delay, w.pending, 2*streamBackoffMin)
	}
	// A renewal succeeds while a stream is open, and then the stream
	// fails: the renewal says nothing of the authority now.
	if _, err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	third := next("after a second renewal succeeded")
	if _, err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	third.end <- down
	if w := drawn(); w.pending {
		t.Error("a renewal that succeeded before the stream failed left a wake: the stream reconnects at once, without backoff")
	}
}
