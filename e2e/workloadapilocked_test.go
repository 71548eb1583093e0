package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A workload asking a locked node's agent for a JWT-SVID is told
// PERMISSION_DENIED, with the authority's reason, not UNAVAILABLE, which
// says the authority could not be reached and is worth retrying at once;
// the authority answered, and refused the node. Before, every refusal
// was UNAVAILABLE.
func TestWorkloadAPIJWTSVIDOfALockedNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j := newJWTEnv(t, ctx, "held-1")
	if _, err := j.client.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "db"}); err != nil {
		t.Fatalf("FetchJWTSVID before the lock: %v", err)
	}
	mustRun(t, "lock", "create", "--node", "held-1", "--reason", "walk", "--data", j.dir)
	// Another audience, so the agent mints rather than reuses.
	_, err := j.client.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "cache"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("FetchJWTSVID of a locked node: %v, want PERMISSION_DENIED naming the lock", err)
	}
}
