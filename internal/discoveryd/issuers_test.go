package discoveryd

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// A replica that starts under another issuer than a running replica of
// the same store warns, naming both issuers and how to list them: the
// authority would refuse every PSK join through one of them. A stopped
// replica's issuer no longer counts.
func TestStartWarnsOfAnotherRunningIssuer(t *testing.T) {
	e := start(t)
	first := e.srv.Issuer()
	ctx := ctxT(t)
	if got, err := runningIssuers(ctx, e.st, first); err != nil || len(got) != 0 {
		t.Fatalf("runningIssuers beside the only replica = %v, %v; want none", got, err)
	}

	// A second replica on the same store, advertising another name.
	var logs lockedLog
	ready := make(chan string, 1)
	srv, err := New(Config{
		Dir: e.dir, Store: e.st, Listen: "127.0.0.1:0", Advertise: "discovery-b.test:7450",
		Log:   slog.New(slog.NewTextHandler(&logs, nil)),
		Ready: func(addr string) { ready <- addr }, OpenRegistration: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the second replica stopped at start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the second replica did not start in 20s")
	}
	second := srv.Issuer()
	for _, want := range []string{"level=WARN", "started under the ticket issuer " + first + ", not " + second,
		"start every replica with the same --advertise", "muster discovery audit list --data " + e.dir + " --action 'discovery.*'"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the second replica's log lacks %q:\n%s", want, logs.String())
		}
	}
	if got, err := runningIssuers(ctx, e.st, first); err != nil || !slices.Equal(got, []string{second}) {
		t.Errorf("runningIssuers seen from the first = %v, %v; want [%s]", got, err, second)
	}

	// Stopped, the second replica's issuer no longer counts; nor does the
	// first's once it stops too.
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the second replica did not stop in 20s")
	}
	if got, err := runningIssuers(ctx, e.st, first); err != nil || len(got) != 0 {
		t.Errorf("runningIssuers after the second stopped = %v, %v; want none", got, err)
	}
	e.stop()
	if got, err := runningIssuers(ctx, e.st, "https://discovery-c.test:7450"); err != nil || len(got) != 0 {
		t.Errorf("runningIssuers after both stopped = %v, %v; want none", got, err)
	}
}

// lockedLog collects a logger's output for a test to read meanwhile.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
