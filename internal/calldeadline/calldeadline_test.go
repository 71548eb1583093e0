package calldeadline

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/tap"
)

func TestTap(t *testing.T) {
	const d = 50 * time.Millisecond
	tests := []struct {
		name         string
		method       string
		callerAllows time.Duration // 0: the caller sets no deadline
		cancelFirst  bool          // the caller ends the call before d
		wantDeadline bool
		wantTimedOut bool
	}{
		{"a call not bounded keeps the caller's context", "/free", 0, false, false, false},
		{"no deadline given: the call timeout's, reported", "/bounded", 0, false, true, true},
		{"a later deadline given: the call timeout's, reported", "/bounded", time.Hour, false, true, true},
		{"a sooner deadline given: the caller's, not reported", "/bounded", 10 * time.Millisecond, false, true, false},
		{"ended by the caller first: not reported", "/bounded", 0, true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reported := make(chan string, 1)
			h := Tap(d, func(m string) bool { return m == "/bounded" }, func(_ context.Context, m string) { reported <- m })
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.callerAllows > 0 {
				parent, cancel = context.WithTimeout(parent, tt.callerAllows)
				defer cancel()
			}
			ctx, err := h(parent, &tap.Info{FullMethodName: tt.method})
			if err != nil {
				t.Fatal(err)
			}
			dl, ok := ctx.Deadline()
			if ok != tt.wantDeadline {
				t.Fatalf("deadline set %v, want %v", ok, tt.wantDeadline)
			}
			if ok && time.Until(dl) > d {
				t.Fatalf("deadline in %s, want at most %s", time.Until(dl), d)
			}
			if tt.cancelFirst {
				cancel()
			}
			select {
			case m := <-reported:
				if !tt.wantTimedOut || m != tt.method {
					t.Fatalf("reported %q, want a report %v", m, tt.wantTimedOut)
				}
			case <-time.After(4 * d):
				if tt.wantTimedOut {
					t.Fatal("no report of a call ended at the call timeout")
				}
			}
		})
	}
}
