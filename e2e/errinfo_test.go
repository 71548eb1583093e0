package e2e

import (
	"testing"

	"github.com/muster-dev/muster/internal/errinfo"
)

// wantReason checks the machine-readable reason of a refusal: the
// google.rpc.ErrorInfo of domain muster.dev in the status details.
func wantReason(t *testing.T, err error, reason string) {
	t.Helper()
	if got := errinfo.Reason(err); got != reason {
		t.Fatalf("refusal %v carries reason %q, want %q", err, got, reason)
	}
}
