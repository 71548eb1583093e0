package authority

import (
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

var againAfter = regexp.MustCompile(`again after (\S+)$`)

// retryTime is the time a refusal says to run the command again after.
func retryTime(t *testing.T, err error) time.Time {
	t.Helper()
	m := againAfter.FindStringSubmatch(status.Convert(err).Message())
	if m == nil {
		t.Fatalf("the refusal names no time to try again: %v", err)
	}
	at, err := time.Parse(time.RFC3339, m[1])
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// TestRetryAfterIsNotEarly: a refusal that says when to run the command
// again names a time at which it is no longer refused, not that time cut
// to its second (an operator, or a script, acting at the named second was
// refused again for up to a second): the activation of an intermediate
// within its publish window, a JWT key rotation within its minimum period.
func TestRetryAfterIsNotEarly(t *testing.T) {
	t.Parallel()
	b := startReplicas(t, nil, 1)
	ctx := t.Context()
	a := &adminService{s: b.srvs[0]}

	if _, err := a.PrepareCAIntermediate(ctx, &musterv1.PrepareCAIntermediateRequest{Role: "agent"}); err != nil {
		t.Fatal(err)
	}
	_, err := a.ActivateCAIntermediate(ctx, &musterv1.ActivateCAIntermediateRequest{Role: "agent"})
	rows, lerr := b.store.ListCACerts(ctx)
	if lerr != nil {
		t.Fatal(lerr)
	}
	found := false
	for _, r := range rows {
		if r.Role == "agent" && r.State == store.CAPrepared {
			found = true
			if ready, at := r.CreatedAt.Add(caPublishWindow), retryTime(t, err); at.Before(ready) {
				t.Errorf("activation: told to try again after %v; refused until %v", at, ready)
			}
		}
	}
	if !found {
		t.Fatal("no prepared agent intermediate")
	}

	if _, err := a.RotateJWTKey(ctx, &musterv1.RotateJWTKeyRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err = a.RotateJWTKey(ctx, &musterv1.RotateJWTKeyRequest{})
	k, kerr := b.store.GetJWTKey(ctx)
	if kerr != nil {
		t.Fatal(kerr)
	}
	if ready, at := k.RotatedAt.Add(MinJWTKeyRotationPeriod), retryTime(t, err); at.Before(ready) {
		t.Errorf("JWT key rotation: told to try again after %v; refused until %v", at, ready)
	}
}
