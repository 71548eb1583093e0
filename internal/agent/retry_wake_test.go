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

	minB, maxB := backoffMin, backoffMax
	t.Cleanup(func() { backoffMin, backoffMax = minB, maxB })
	backoffMin, backoffMax = 10000*time.Hour, 40000*time.Hour

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
