package cli

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
}
