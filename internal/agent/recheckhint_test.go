package agent

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/errinfo"
)

// The locked hints say how often agent run asks again from lockedRecheck
// itself, so the text cannot drift from the interval.
func TestLockedHintSaysTheRecheckInterval(t *testing.T) {
	recheck := lockedRecheck
	t.Cleanup(func() { lockedRecheck = recheck })
	st := &State{NodeID: "n1", BoundKeypair: "n1"}
	for _, c := range []struct {
		recheck time.Duration
		want    string
	}{
		{15 * time.Minute, "every 15 minutes for one without a TTL"},
		{7 * time.Minute, "every 7 minutes for one without a TTL"},
		{time.Hour, "every hour for one without a TTL"},
		{90 * time.Minute, "every 90 minutes for one without a TTL"},
		{100 * time.Millisecond, "every 100ms for one without a TTL"},
	} {
		lockedRecheck = c.recheck
		locked := errinfo.Error(codes.PermissionDenied, "locked", "locked")
		for name, err := range map[string]error{
			"renewal":       standingHint(locked, st, "/var/lib/muster-agent"),
			"bound-keypair": boundRefusalHint(locked, st, "/var/lib/muster-agent"),
		} {
			if s, _ := status.FromError(err); !strings.Contains(s.Message(), c.want) {
				t.Errorf("%s refusal with lockedRecheck %v: %q, want %q", name, c.recheck, s.Message(), c.want)
			}
		}
	}
}

func TestEvery(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Second:             "every second",
		30 * time.Second:        "every 30 seconds",
		time.Minute:             "every minute",
		15 * time.Minute:        "every 15 minutes",
		2 * time.Hour:           "every 2 hours",
		90 * time.Second:        "every 90 seconds",
		1500 * time.Millisecond: "every 1.5s",
	} {
		if got := every(d); got != want {
			t.Errorf("every(%v) = %q, want %q", d, got, want)
		}
	}
}
