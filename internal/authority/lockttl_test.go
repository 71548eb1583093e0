package authority

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestLockTTLBounds: a lock's TTL is at least a second, as a token's
// (jointoken.MinTTL): a shorter or negative one is refused with the
// minimum and the way to a lock without one, and creates nothing; none
// (or 0) is a lock until deleted. Before, 1ns was taken (a lock that
// lapsed before it refused anything) and a negative TTL was told only
// "must be positive".
func TestLockTTLBounds(t *testing.T) {
	t.Parallel()
	b := startReplicas(t, nil, 1)
	a := &adminService{s: b.srvs[0]}
	ctx := t.Context()
	for _, ttl := range []time.Duration{time.Nanosecond, 999 * time.Millisecond, -5 * time.Minute} {
		_, err := a.CreateLock(ctx, &musterv1.CreateLockRequest{Kind: "node", Target: "web-1", Ttl: durationpb.New(ttl)})
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, "lock ttl must be at least 1s") ||
			!strings.Contains(msg, "omit --ttl for a lock that lasts until it is deleted") || !strings.Contains(msg, "got "+ttl.String()) {
			t.Errorf("ttl %s: %v, want INVALID_ARGUMENT naming the minimum", ttl, err)
		}
	}
	if locks, err := b.srvs[0].store.ListLocks(ctx); err != nil || len(locks) != 0 {
		t.Fatalf("locks after refusals: %v, %v", locks, err)
	}
	for _, tc := range []struct {
		ttl     *durationpb.Duration
		expires bool
	}{
		{durationpb.New(time.Second), true},
		{durationpb.New(0), false},
		{nil, false},
	} {
		resp, err := a.CreateLock(ctx, &musterv1.CreateLockRequest{Kind: "node", Target: "web-1", Ttl: tc.ttl})
		if err != nil {
			t.Fatalf("ttl %v: %v", tc.ttl, err)
		}
		if got := resp.GetLock().GetExpiresAt() != nil; got != tc.expires {
			t.Errorf("ttl %v: expires %v, want %v", tc.ttl, got, tc.expires)
		}
	}
}
