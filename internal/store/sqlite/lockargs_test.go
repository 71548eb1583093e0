package sqlite

import (
	"fmt"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// TestLockArgs: each target's kind and value, in order; a known kind as
// an argument allocates nothing (each is boxed once; a target's value
// still is, one allocation), any other kind is passed as it is.
func TestLockArgs(t *testing.T) {
	targets := []store.LockTarget{
		{Kind: store.LockNode, Target: "n1"}, {Kind: store.LockInstance, Target: "i1"},
		{Kind: store.LockToken, Target: "t1"}, {Kind: store.LockPublicKey, Target: "ab12"},
		{Kind: store.LockAdmin, Target: "a"}, {Kind: "other", Target: "o"},
	}
	got := lockArgs(targets)
	if want := "[node n1 instance i1 token t1 public_key ab12 admin a other o]"; fmt.Sprint(got) != want {
		t.Fatalf("lockArgs = %v, want %s", got, want)
	}
	buf := make([]any, 0, 2*len(targets))
	known := targets[:5]
	if n := testing.AllocsPerRun(100, func() { buf = appendLockArgs(buf[:0], known) }); n > float64(len(known)) {
		t.Errorf("appendLockArgs of %d targets of the known kinds: %v allocations, want at most %d (the values')", len(known), n, len(known))
	}
}
