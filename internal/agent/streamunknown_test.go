package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/errinfo"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// A stream refused because the authority has no record of the agent's
// certificate (its store restored from an older backup) is a refusal for
// the node's standing: the agent logs the join that brings it back, with
// its own directory, and renews at once, whose refusal stops it with the
// same way out, instead of learning it at its next renewal, hours later.
func TestStreamCertificateUnknownActsAtOnce(t *testing.T) {
	unknown := errinfo.Error(codes.PermissionDenied, "certificate unknown to this authority", "certificate_unknown")
	f, dir, logs, err := runRefusedStream(t, unknown)
	rejoin := RejoinCommand(dir, "n1")
	if err == nil || errinfo.Reason(err) != "certificate_unknown" || !strings.Contains(err.Error(), rejoin) {
		t.Errorf("agent run ended with %v, want certificate_unknown naming %q", err, rejoin)
	}
	if _, _, n := f.calls(); n != 1 {
		t.Errorf("%d renewal requests, want 1", n)
	}
	if !strings.Contains(logs, "refused for the node's standing") || !strings.Contains(logs, rejoin) {
		t.Errorf("the stream's refusal was not logged with the way out %q:\n%s", rejoin, logs)
	}
}

// A stream refused UNAUTHENTICATED because the certificate's issuer is none
// the authority holds (issuer_unknown: its store restored from a backup
// taken before that intermediate was prepared) acts at once as well: the
// agent renews, is refused the same, and stops with the join, its own
// directory filled in, instead of reconnecting until its next renewal.
func TestStreamIssuerUnknownActsAtOnce(t *testing.T) {
	unheld := errinfo.Error(codes.Unauthenticated, "client certificate not issued by this authority's intermediates: "+
		"join again over this identity: muster agent join --force --data ADIR --node n1 with a joining URI from muster token create --node n1",
		errinfo.ReasonIssuerUnknown)
	f, dir, logs, err := runRefusedStream(t, unheld)
	rejoin := RejoinCommand(dir, "n1")
	if err == nil || errinfo.Reason(err) != errinfo.ReasonIssuerUnknown || !strings.Contains(err.Error(), rejoin) {
		t.Errorf("agent run ended with %v, want issuer_unknown naming %q", err, rejoin)
	}
	if _, _, n := f.calls(); n != 1 {
		t.Errorf("%d renewal requests, want 1", n)
	}
	if !strings.Contains(logs, "refused for the node's standing") {
		t.Errorf("the stream's refusal was not logged:\n%s", logs)
	}
}

// runRefusedStream runs a joined agent whose authority refuses its stream
// and its renewals with refusal, and returns once the agent's run has
// ended, failing the test if it still runs a minute later.
func runRefusedStream(t *testing.T, refusal error) (f *fakeAuthority, dir Dir, logs string, err error) {
	t.Helper()
	setStreamBackoff(t, time.Millisecond, time.Millisecond)
	f = newFakeAuthority(t, fakeOptions{ttl: 24 * time.Hour})
	_, dir = joined(t, f)
	f.mu.Lock()
	f.connect = func(musterv1.AgentService_ConnectServer) error { return refusal }
	for range 10 {
		f.renewErrs = append(f.renewErrs, refusal)
	}
	f.mu.Unlock()
	var buf syncBuffer
	a := New(Options{Dir: dir, Timeout: 5 * time.Second, Log: slog.New(slog.NewJSONHandler(&buf, nil))})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err = a.Run(ctx, nil)
	if ctx.Err() != nil {
		t.Fatalf("agent run still waiting for its renewal a minute after the stream was refused: %v", err)
	}
	return f, dir, buf.String(), err
}
