package agent

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
)

// A bound-keypair refusal that ends agent run (or that it retries) names
// the way out, and keeps the code, the reason word and its details.
func TestBoundRefusalHint(t *testing.T) {
	st := &State{NodeID: "br1", BoundKeypair: "br1"}
	for _, c := range []struct {
		code   codes.Code
		reason string
		want   string
	}{
		{codes.FailedPrecondition, "recovery_exhausted", "raise spec.bound_keypair.recovery.limit"},
		{codes.PermissionDenied, "join_state_mismatch", "muster audit list --action agent.join"},
		{codes.PermissionDenied, "locked", "muster lock list"},
		{codes.PermissionDenied, "copy_detected", "muster lock list"},
		{codes.FailedPrecondition, "registration_closed", "muster token delete br1 and muster bot add br1"},
	} {
		err := boundRefusalHint(errinfo.Error(c.code, c.reason, c.reason), st)
		s, _ := status.FromError(err)
		if s.Code() != c.code || errinfo.Reason(err) != c.reason || !strings.HasPrefix(s.Message(), c.reason+"; ") || !strings.Contains(s.Message(), c.want) {
			t.Errorf("%s: got %v (reason %q), want the reason kept and %q", c.reason, err, errinfo.Reason(err), c.want)
		}
		if c.reason == "recovery_exhausted" && !retryableBound(err) {
			t.Error("recovery_exhausted with its hint is no longer retried")
		}
	}
	other := errinfo.Error(codes.Unauthenticated, "challenge_failed", "challenge_failed")
	if got := boundRefusalHint(other, st); got != other {
		t.Errorf("challenge_failed changed: %v", got)
	}
}

// A PSK that no longer matches (rotated away while the machine was
// offline) names where the active one is, keeping code and reason word.
func TestPSKRefusalHint(t *testing.T) {
	for reason, msg := range map[string]string{"psk_mismatch": "bootstrap PSK does not match", "psk_missing": "bootstrap PSK is missing"} {
		err := pskRefusalHint(errinfo.Error(codes.PermissionDenied, msg, reason))
		s, _ := status.FromError(err)
		if s.Code() != codes.PermissionDenied || errinfo.Reason(err) != reason || !strings.HasPrefix(s.Message(), msg+"; ") || !strings.Contains(s.Message(), "muster psk show") {
			t.Errorf("%s: got %v", reason, err)
		}
	}
	other := errinfo.Error(codes.AlreadyExists, "node ID already exists", "node_taken")
	if got := pskRefusalHint(other); got != other {
		t.Errorf("node_taken changed: %v", got)
	}
}
