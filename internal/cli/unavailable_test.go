package cli

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/errinfo"
)

// TestDescribeStoreUnavailable: an UNAVAILABLE the authority answered
// because its store was down says so, not that the authority cannot be
// reached; a transport's UNAVAILABLE still says the authority cannot be
// reached.
func TestDescribeStoreUnavailable(t *testing.T) {
	got := describe(errinfo.Error(codes.Unavailable, "the authority's store is unavailable; retry later", errinfo.ReasonStoreUnavailable))
	if strings.Contains(got, "cannot reach the authority") || !strings.Contains(got, "UNAVAILABLE: the authority's store is unavailable") {
		t.Errorf("store down: %q", got)
	}
	got = describe(status.Error(codes.Unavailable, "connection error: dial tcp 127.0.0.1:1: connect: connection refused"))
	if !strings.Contains(got, "cannot reach the authority") {
		t.Errorf("authority down: %q", got)
	}
	// Discovery down while an agent joins through it: discovery is named,
	// not the authority, which was never asked.
	down := status.Error(codes.Unavailable, "connection error: dial tcp 127.0.0.1:7450: connect: connection refused")
	got = describe(&agent.DiscoveryError{Addr: "127.0.0.1:7450", Step: "looking up prod-a3f2e1", Err: down})
	if strings.Contains(got, "the authority") || !strings.Contains(got, "UNAVAILABLE: cannot reach discovery at 127.0.0.1:7450 (looking up prod-a3f2e1): connection error") {
		t.Errorf("discovery down: %q", got)
	}
	// A refusal by discovery says it was discovery's.
	got = describe(&agent.DiscoveryError{Addr: "127.0.0.1:7450", Step: "referral ticket", Err: status.Error(codes.PermissionDenied, "node ID web-01 is not allowed")})
	if got != "PERMISSION_DENIED: discovery 127.0.0.1:7450 (referral ticket): node ID web-01 is not allowed" {
		t.Errorf("discovery refusal: %q", got)
	}
}
