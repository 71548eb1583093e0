package agent

import (
	"testing"
	"time"
)

// A stream opened with a certificate already expired (an agent waiting
// for a recovery, its budget spent) ended by a refusal, not by its
// certificate's end: it must not reset the backoff, or the agent opens a
// stream every second for as long as the recovery waits.
func TestOutlivedExpiredAtStart(t *testing.T) {
	f := newFakeAuthority(t, fakeOptions{})
	_, dir := joined(t, f)
	_, id, err := New(Options{Dir: dir}).loadLocked(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	leaf := id.Leaf()
	var now time.Time
	a := New(Options{Dir: dir, Now: func() time.Time { return now }})

	now = leaf.NotAfter.Add(time.Second)
	if !a.outlived(leaf, leaf.NotAfter.Add(-time.Minute)) {
		t.Error("a stream opened before its certificate's end and closed after it: not outlived")
	}
	if a.outlived(leaf, leaf.NotAfter.Add(time.Millisecond)) {
		t.Error("a stream opened with an expired certificate, not replaced since: outlived (the backoff starts again)")
	}
	now = leaf.NotAfter.Add(-time.Minute)
	if a.outlived(leaf, now.Add(-time.Minute)) {
		t.Error("a valid certificate, not replaced: outlived")
	}
}
