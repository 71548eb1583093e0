package loadgen

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/muster-dev/muster/internal/agent"
)

func TestAgentDeadline(t *testing.T) {
	near := time.Now().Add(time.Second)
	tests := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want func(time.Time) bool
	}{
		{"none given: the agent's", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			func(d time.Time) bool {
				left := time.Until(d)
				return left > agent.DefaultTimeout-5*time.Second && left <= agent.DefaultTimeout
			}},
		{"the caller's kept", func() (context.Context, context.CancelFunc) { return context.WithDeadline(context.Background(), near) },
			func(d time.Time) bool { return d.Equal(near) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := tt.ctx()
			defer cancel()
			var got time.Time
			var ok bool
			invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				got, ok = ctx.Deadline()
				return nil
			}
			if err := agentDeadline(ctx, "/m", nil, nil, nil, invoker); err != nil {
				t.Fatal(err)
			}
			if !ok || !tt.want(got) {
				t.Fatalf("deadline %v (set %v)", got, ok)
			}
		})
	}
}
