package agent

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestStreamWaitsWithAnExpiredCertificate: an agent whose certificate
// has expired (a bound-keypair agent waiting for its recovery) opens no
// stream with it — the authority would refuse each one, and audit it —
// but tells the recovery, backing off, that the authority answers again;
// a renewal that gives it a valid certificate opens the stream at once.
func TestStreamWaitsWithAnExpiredCertificate(t *testing.T) {
	setStreamBackoff(t, time.Millisecond, 5*time.Millisecond)
	dir, st, clock, connects := expiredStreamAgent(t)
	var logs syncBuffer
	a := New(Options{Dir: dir, Timeout: 5 * time.Second, Now: clock.Now, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.keepStream(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// The recovery's backoff is told the authority answers.
	select {
	case <-a.retryWake:
	case <-time.After(time.Minute):
		t.Fatal("the recovery was not told that the authority answers")
	}
	// Many turns of its backoff later, still no stream.
	for range 3 {
		select {
		case <-a.retryWake:
		case <-time.After(time.Minute):
			t.Fatal("the stream stopped telling the recovery")
		}
	}
	select {
	case <-connects:
		t.Fatal("a stream was opened with the expired certificate")
	default:
	}
	if !strings.Contains(logs.String(), "certificate expired: the stream to the authority waits") {
		t.Errorf("the log does not say why there is no stream:\n%s", logs.String())
	}
	// A valid certificate (the clock back before its end, as a recovery's
	// new one would be) and the renewal's wake: the stream opens.
	clock.set(st.NotAfter.Add(-time.Minute))
	a.authorityAnswered()
	select {
	case <-connects:
	case <-time.After(time.Minute):
		t.Fatal("no stream opened once the certificate was valid")
	}
}

// TestStreamLogsTheAgentsDirectory: a refusal of the stream whose way
// out the authority names with --data ADIR is logged with this agent's
// directory, whatever the refusal.
func TestStreamLogsTheAgentsDirectory(t *testing.T) {
	setStreamBackoff(t, time.Millisecond, time.Millisecond)
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	f.mu.Lock()
	f.connect = func(musterv1.AgentService_ConnectServer) error {
		return status.Error(codes.Unauthenticated, "client certificate expired or not yet valid; muster agent join --force --data ADIR --node n1 with a joining URI")
	}
	f.mu.Unlock()
	var logs syncBuffer
	a := New(Options{Dir: dir, Timeout: 5 * time.Second, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.keepStream(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, nil, "the stream's refusal", func() bool {
		return strings.Contains(logs.String(), "stream to the authority closed; reconnecting")
	})
	if l := logs.String(); strings.Contains(l, "--data ADIR") || !strings.Contains(l, "--data "+string(dir)+" --node n1") {
		t.Errorf("log does not name the agent's directory:\n%s", l)
	}
}

// TestStreamSeesARecoveryJustAfterReadingTheExpiredCertificate: a
// recovery that gives the agent a valid certificate (and wakes the
// stream) just after the stream read the expired one is not missed: the
// stream opens at once rather than after its backoff (up to 2 minutes,
// the tasks waiting with it). Before, the wake was drained after the
// read, and lost.
func TestStreamSeesARecoveryJustAfterReadingTheExpiredCertificate(t *testing.T) {
	setStreamBackoff(t, 10000*time.Hour, 40000*time.Hour)
	dir, st, clock, connects := expiredStreamAgent(t)
	var a *Agent
	var once sync.Once
	// The first read of the clock (the stream finding the certificate
	// expired) is followed at once by the recovery's success: a valid
	// certificate and its wake.
	now := func() time.Time {
		t := clock.Now()
		once.Do(func() {
			clock.set(st.NotAfter.Add(-time.Minute))
			a.authorityAnswered()
		})
		return t
	}
	a = New(Options{Dir: dir, Timeout: 5 * time.Second, Now: now})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.keepStream(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-connects:
	case <-time.After(time.Minute):
		t.Fatal("the stream missed the recovery's wake and waits out its backoff")
	}
}

// expiredStreamAgent joins an agent to a fake authority whose streams,
// each reported on connects as it opens, stay open until the agent ends
// them; the agent's clock is a minute past its certificate's expiry.
func expiredStreamAgent(t *testing.T) (dir Dir, st *State, clock *testClock, connects <-chan struct{}) {
	t.Helper()
	f := newFakeAuthority(t, fakeOptions{ttl: time.Hour})
	_, dir = joined(t, f)
	opened := make(chan struct{}, 100)
	f.mu.Lock()
	f.connect = func(s musterv1.AgentService_ConnectServer) error {
		opened <- struct{}{}
		<-s.Context().Done()
		return nil
	}
	f.mu.Unlock()
	st, err := dir.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	clock = &testClock{}
	clock.set(st.NotAfter.Add(time.Minute))
	return dir, st, clock, opened
}
