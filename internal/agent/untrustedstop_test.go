package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/identity"
)

// refusedCall is a call whose connection the agent's own check of the
// authority's certificate refused, as verifyerr carries it over gRPC.
type refusedCall struct {
	st      *status.Status
	refused error
}

func (e refusedCall) Error() string              { return e.st.Err().Error() }
func (e refusedCall) GRPCStatus() *status.Status { return e.st }
func (e refusedCall) Unwrap() error              { return e.refused }

// TestRecoveryStopsOnAnUntrustedRoot: a bound-keypair recovery refused by
// the agent's own check of the authority's certificate keeps saying so
// once the way out is added (its code stays UNAVAILABLE), and stops being
// retried once such refusals alone lasted untrustedRootGiveUp; any other
// answer in between starts the count again. Before, the hint dropped the
// cause and the recovery retried it for good.
func TestRecoveryStopsOnAnUntrustedRoot(t *testing.T) {
	dir := Dir(t.TempDir())
	st := &State{NodeID: "n1", BoundKeypair: "n1", JoinMethod: JoinMethodBoundKeypair, Authority: "auth.example:7443"}
	call := refusedCall{st: status.New(codes.Unavailable, "connection error: tls: failed to verify certificate"),
		refused: &identity.UntrustedRootError{Err: errors.New("x509: certificate signed by unknown authority")}}
	err := boundRefusalHint(untrustedAuthorityHint(call, st, dir), st, dir)
	if untrusted := (*identity.UntrustedRootError)(nil); !errors.As(err, &untrusted) {
		t.Fatalf("the hinted refusal lost its cause: %v", err)
	}
	if status.Code(err) != codes.Unavailable || !Transient(err) || !strings.Contains(err.Error(), "muster agent join --force --data") {
		t.Fatalf("the hinted refusal: %v (code %v); want UNAVAILABLE with the way out", err, status.Code(err))
	}
	other := status.Error(codes.Unavailable, "connection refused")
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	var s untrustedStreak
	for _, c := range []struct {
		err  error
		at   time.Duration
		want bool
	}{
		{err, 0, true},
		{err, untrustedRootGiveUp - time.Second, true},
		{other, untrustedRootGiveUp, true}, // the count starts again
		{err, untrustedRootGiveUp + time.Minute, true},
		{err, 2*untrustedRootGiveUp + time.Second, true},
		{err, 2*untrustedRootGiveUp + time.Minute, false},
	} {
		if got := s.retryable(c.err, t0.Add(c.at)); got != c.want {
			t.Fatalf("retryable(%v) at +%s = %v, want %v", c.err, c.at, got, c.want)
		}
	}
}
