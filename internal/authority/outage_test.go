package authority

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/store"
)

// TestStoreOutageLogsTwice: many requests failing on an unavailable store
// log one line as the outage starts and one as the store is back, with
// their count; the calls are answered UNAVAILABLE with the
// store_unavailable reason; other errors are not taken for an outage.
func TestStoreOutageLogsTwice(t *testing.T) {
	old := storeProbeEvery
	storeProbeEvery = 10 * time.Millisecond
	t.Cleanup(func() { storeProbeEvery = old })
	var logs syncBuffer
	var back atomic.Bool
	o := newStoreOutage(slog.New(slog.NewTextHandler(&logs, nil)), func(context.Context) error {
		if back.Load() {
			return nil
		}
		return fmt.Errorf("postgres: now: %w", store.ErrUnavailable)
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { o.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	down := fmt.Errorf("postgres: get: %w: dial tcp: connection refused", store.ErrUnavailable)
	for range 50 {
		answer := toStatus(t.Context(), slog.New(slog.NewTextHandler(&logs, nil)), down)
		if errinfo.Reason(answer) != errinfo.ReasonStoreUnavailable || !strings.Contains(answer.Error(), "Unavailable") {
			t.Fatalf("answer %v, want UNAVAILABLE store_unavailable", answer)
		}
		o.observe(answer)
		if !o.fail(down) {
			t.Fatal("a heartbeat's write on the unavailable store is not taken for the outage")
		}
	}
	if o.fail(errors.New("sqlite: syntax error")) {
		t.Error("another error taken for the outage")
	}
	back.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "available again") {
		if time.Now().After(deadline) {
			t.Fatalf("the store's return is not logged:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	out := logs.String()
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("%d lines for one outage of 50 failed requests, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "failed_requests=50") {
		t.Errorf("the failed requests are not counted:\n%s", out)
	}
}
