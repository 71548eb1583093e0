package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestHealthWatchesPerSourceBehindTrustedProxy: behind a trusted load
// balancer, each client its PROXY header names holds at most 8
// grpc.health.v1.Health/Watch streams; the next is refused
// RESOURCE_EXHAUSTED and audited with its source and why, and another
// client behind the same balancer still watches. Before, one source could
// hold all 64 of the listener's watches.
func TestHealthWatchesPerSourceBehindTrustedProxy(t *testing.T) {
	t.Parallel()
	e := newJoinEnv(t, "--trusted-proxy", "127.0.0.1")
	watch := func(source string) error {
		w, err := healthpb.NewHealthClient(e.dialFrom(t, source, nil)).Watch(t.Context(), &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv() // the first status: the watch is held
		}
		return err
	}
	const greedy, other = "198.51.100.20", "198.51.100.21"
	for i := range 8 {
		if err := watch(greedy); err != nil {
			t.Fatalf("watch %d of %s: %v", i+1, greedy, err)
		}
	}
	if err := watch(greedy); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 9th watch of %s: %v, want RESOURCE_EXHAUSTED", greedy, err)
	}
	if err := watch(other); err != nil {
		t.Fatalf("a watch of %s, behind the same balancer: %v", other, err)
	}
	var recs []map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", e.dir, "--action", "api.access", "-o", "json")), &recs); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, r := range recs {
		reason, _ := r["reason"].(string)
		if r["source"] == greedy && r["target"] == healthpb.Health_Watch_FullMethodName && r["result"] == "denied" &&
			strings.Contains(reason, "the most one source may hold") {
			found = true
		}
	}
	if !found {
		t.Errorf("the refused watch of %s is not audited with its reason: %v", greedy, recs)
	}
}
