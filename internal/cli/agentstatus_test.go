package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/agent"
)

// agent status on an expired bound-keypair agent whose last answer left
// no recovery does not promise that agent run recovers: it names raising
// the budget, which is what makes the recovery work.
func TestValidNote(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	zero, one := int64(0), int64(1)
	bound := func(expired bool, left *int64) *agent.Status {
		return &agent.Status{State: agent.State{JoinMethod: agent.JoinMethodBoundKeypair, BoundKeypair: "br1",
			RecoveriesRemaining: left, NotAfter: now.Add(time.Minute)}, Expired: expired}
	}
	for _, c := range []struct {
		s    *agent.Status
		want string
	}{
		{bound(true, &zero), "raise the token's spec.bound_keypair.recovery.limit"},
		{bound(true, &one), "(EXPIRED: muster agent run recovers with the bound key)"},
		{bound(true, nil), "(EXPIRED: muster agent run recovers with the bound key)"},
		{&agent.Status{State: agent.State{JoinMethod: "token", NodeID: "web-1"}, Expired: true},
			"join again with a new token: muster agent join --force --data /var/lib/muster-agent --node web-1 with a joining URI from muster token create --node web-1"},
		{bound(false, &zero), "(in 1m0s)"},
	} {
		if got := validNote(c.s, "/var/lib/muster-agent", now); !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want %q", c.s.RecoveriesRemaining, got, c.want)
		}
	}
	if got := validNote(bound(true, &zero), "/var/lib/muster-agent", now); strings.Contains(got, "EXPIRED: muster agent run recovers") {
		t.Errorf("no recovery left, yet: %q", got)
	}
}

// TestBoundKeypairLine: agent status says "none" only where there is no
// bound key file; one that exists but gives no key is named unusable,
// with why.
func TestBoundKeypairLine(t *testing.T) {
	s := &agent.Status{State: agent.State{JoinMethod: agent.JoinMethodBoundKeypair, BoundKeypair: "br1"}}
	if got := boundKeypairLine(s); !strings.Contains(got, "key none in keys/bound.key,") {
		t.Errorf("no key file: %s", got)
	}
	s.BoundKeyProblem = "open /var/lib/muster-agent/keys/bound.key: permission denied"
	if got := boundKeypairLine(s); !strings.Contains(got, "key UNUSABLE (open /var/lib/muster-agent/keys/bound.key: permission denied),") || strings.Contains(got, "none") {
		t.Errorf("unreadable key file: %s", got)
	}
	s.BoundKeyProblem, s.BoundKeyFingerprint = "", "SHA256:abc"
	if got := boundKeypairLine(s); !strings.Contains(got, "key SHA256:abc,") || strings.Contains(got, "rotation") {
		t.Errorf("a key: %s", got)
	}
	s.BoundKeyRotationPending, s.BoundKeyNextFingerprint = true, "SHA256:new"
	if got := boundKeypairLine(s); !strings.Contains(got, "Bound key rotation pending: keys/bound.next.key (SHA256:new)") {
		t.Errorf("a pending rotation: %s", got)
	}
}
