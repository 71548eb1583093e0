package agent

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// A discovery whose TLS identity does not match the pinned fingerprint is
// a configuration error (discovery's CA does not rotate): agent run stops
// with PERMISSION_DENIED and the way out, instead of retrying it as
// UNAVAILABLE forever.
func TestRunStopsOnADiscoveryPinMismatch(t *testing.T) {
	shortBackoff(t)
	f := newFakeAuthority(t, fakeOptions{})
	a := newTestAgent(t, Dir(t.TempDir()))
	join := func() (JoinRequest, error) {
		// The fake authority stands in for discovery: its CA is not the
		// pinned one.
		return JoinRequest{Node: "n1", Discovery: f.addr, DiscoveryFingerprint: "sha256:" + strings.Repeat("ab", 32),
			AuthorityID: "prod-a3f2e1", CAFingerprint: f.h.Fingerprint()}, nil
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(t.Context(), join) }()
	select {
	case err := <-done:
		if codeOf(err) != codes.PermissionDenied || Transient(err) ||
			!strings.Contains(err.Error(), "does not match the pinned fingerprint") ||
			!strings.Contains(err.Error(), "muster discovery show --data DIR") {
			t.Fatalf("agent run with a wrong discovery pin: %v (%s), want PERMISSION_DENIED naming muster discovery show --data DIR", err, codeOf(err))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent run with a wrong discovery pin still retries after 30 s")
	}
}
