package sqlite

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// doneCounting counts the calls to Done of a cancellable context: each is
// database/sql or the driver arming a goroutine to watch for cancellation.
type doneCounting struct {
	context.Context
	calls atomic.Int64
}

func (c *doneCounting) Done() <-chan struct{} {
	c.calls.Add(1)
	return c.Context.Done()
}

// TestRequestPathReadsWatchNoCancellation: the reads of a join and a
// renewal do not hand the caller's cancellation to database/sql and the
// driver (a goroutine each per query), and a context already ended still
// ends them, with its error.
func TestRequestPathReadsWatchNoCancellation(t *testing.T) {
	s, _ := openTemp(t)
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := &doneCounting{Context: parent}
	targets := []store.LockTarget{{Kind: store.LockNode, Target: "n1"}}
	if _, err := s.ReadJoin(ctx, "tok", "n1", targets); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadRenewal(ctx, "serial", []string{"k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SignerSetID(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetCertificate(ctx, "serial"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetCertificate: %v", err)
	}
	if n := ctx.calls.Load(); n != 0 {
		t.Errorf("the reads asked the caller's context for Done %d times", n)
	}

	cancel()
	if _, err := s.ReadJoin(parent, "tok", "n1", targets); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadJoin with an ended context: %v, want context.Canceled", err)
	}
	if _, err := s.ReadRenewal(parent, "serial", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadRenewal with an ended context: %v, want context.Canceled", err)
	}
	if _, err := s.GetNode(parent, "n1"); !errors.Is(err, context.Canceled) {
		t.Errorf("GetNode with an ended context: %v, want context.Canceled", err)
	}
}
