package crl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// failingStore fails every pass at its first read with err, counting the
// passes.
type failingStore struct {
	memStore
	err error

	mu     sync.Mutex
	passes int
}

func (f *failingStore) Now(context.Context) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.passes++
	return time.Time{}, f.err
}

func (f *failingStore) passesMade() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.passes
}

// syncBuffer is a log destination Run writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A pass that fails because the store is unavailable is not logged: the
// authority logs the outage once, when it starts and when it ends
// (docs/high-availability.md, "During a database outage"), and a
// publisher retrying every 5 seconds logged an error each time, on every
// replica, for as long as the database was away. Any other failure is
// still logged.
func TestRunDoesNotLogTheStoreOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		logged bool
	}{
		{"store unavailable", fmt.Errorf("postgres: now: %w", store.ErrUnavailable), false},
		{"another failure", errors.New("disk on fire"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &failingStore{err: tc.err}
			var logs syncBuffer
			p := New(Config{Store: st, Issuers: func() []Issuer { return nil }, Log: slog.New(slog.NewTextHandler(&logs, nil))})
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			// A second pass, made on a poke, starts after the first
			// failure was handled (logged or not).
			deadline := time.Now().Add(30 * time.Second)
			for st.passesMade() < 2 {
				if time.Now().After(deadline) {
					t.Fatal("no second pass within 30s")
				}
				p.Poke()
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := strings.Contains(logs.String(), "revocation lists failed"); got != tc.logged {
				t.Errorf("failure logged: %v, want %v; logs:\n%s", got, tc.logged, logs.String())
			}
		})
	}
}
