package agent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestRetryEndsItsWaitWhenTheStreamOpens: a renewal (or a bound-keypair
// agent's refresh or recovery) backing off after the authority was
// unreachable retries as soon as a stream to the authority opens again,
// not after a backoff grown to minutes. Before, the retry was never woken
// and waited the whole backoff (here, one no test outlives).
func TestRetryEndsItsWaitWhenTheStreamOpens(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, _ := joined(t, f)

	setBackoff(t, 10000*time.Hour, 40000*time.Hour)

	f.mu.Lock()
	f.connect = func(stream musterv1.AgentService_ConnectServer) error {
		<-stream.Context().Done()
		return stream.Context().Err()
	}
	f.mu.Unlock()

	ctx, cancel := context.WithCancel(t.Context())
	streamDone := make(chan struct{})
	t.Cleanup(func() { cancel(); <-streamDone })
	attempts := 0
	result := make(chan error, 1)
	go func() {
		result <- a.retry(ctx, "renewal", time.Time{}, func() error {
			attempts++
			if attempts == 1 {
				// The authority comes back as this attempt fails: the
				// stream reconnects while the retry waits.
				go func() { defer close(streamDone); a.keepStream(ctx) }()
				return status.Error(codes.Unavailable, "authority unreachable")
			}
			return nil
		})
	}()
	const deadline = 60 * time.Second
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if attempts != 2 {
			t.Errorf("%d attempts, want 2", attempts)
		}
	case <-time.After(deadline):
		t.Fatalf("the retry still waits its backoff %s after the stream to the authority opened", deadline)
	}
}

// TestSpentBudgetRecoveryNotWokenByTheStream: a recovery refused for a
// spent budget (recovery_exhausted) is asked again at its own backoff, not
// whenever the stream finds the authority reachable: the authority
// answered, and answers the same until an operator raises the limit.
// Before, each probe woke it, so a spent-budget agent sent a refused
// recovery at the stream's retry pace. Here the backoff is one no test
// outlives: every wake the stream sends must leave the count of recovery
// requests at one.
func TestSpentBudgetRecoveryNotWokenByTheStream(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	a, _ := joined(t, f)

	setBackoff(t, 10000*time.Hour, 40000*time.Hour)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	requests := make(chan int, 16)
	n := 0
	result := make(chan error, 1)
	go func() {
		result <- a.retryIf(ctx, "recovery", time.Time{}, retryableBound, func() error {
			n++
			requests <- n
			return status.Error(codes.FailedPrecondition, "recovery_exhausted: token bot-1 has used 1 of 1 recoveries")
		})
	}()
	if got := <-requests; got != 1 {
		t.Fatalf("first request numbered %d", got)
	}
	// The stream's probes: each wake the old code took at once (the
	// channel holds one, so each is sent after the last was taken or
	// left).
	for range 5 {
		wake(a.retryWake)
		select {
		case got := <-requests:
			t.Fatalf("recovery request %d sent on the stream's wake, want only the first until the backoff ends", got)
		case <-time.After(300 * time.Millisecond):
		}
	}
	cancel()
	if err := <-result; err == nil {
		t.Fatal("the retry ended without an error when cancelled")
	}
}
