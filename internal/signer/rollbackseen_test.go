package signer

import (
	"errors"
	"testing"
	"time"
)

// TestRollbackSeenIsTakenOnce: two rollbacks asked on what one listing
// showed (two operators, or a retry through another replica) cannot both
// succeed. The first puts the predecessor back; the second, whose
// meaning would now be "discard the staged signer", is refused and
// changes nothing, and a rollback naming another signer than the one it
// would move is refused too.
func TestRollbackSeenIsTakenOnce(t *testing.T) {
	ctx := t.Context()
	k, clock, _ := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, Actor{Name: "authority"}); err != nil {
		t.Fatal(err)
	}
	res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	v2 := res.Changes[0].To.VersionID
	clock.offset = time.Hour + time.Second
	if _, err := k.Tick(ctx, Actor{Name: "authority"}); err != nil {
		t.Fatal(err)
	}
	snap, err := k.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := Seen{VersionID: v2, SetVersion: snap.Version()}

	if _, err := k.RollbackSeen(ctx, who, Seen{VersionID: "v1", SetVersion: seen.SetVersion}); !errors.Is(err, ErrNotThatRotation) || !IsRule(err) {
		t.Fatalf("rollback naming v1 = %v, want ErrNotThatRotation", err)
	}
	if _, err := k.RollbackSeen(ctx, who, seen); err != nil {
		t.Fatalf("first rollback: %v", err)
	}
	after, err := k.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, again := range []Seen{seen, {SetVersion: seen.SetVersion}} {
		if _, err := k.RollbackSeen(ctx, who, again); !errors.Is(err, ErrChanged) {
			t.Fatalf("second rollback on %+v = %v, want ErrChanged", again, err)
		}
	}
	now, err := k.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if now.Version() != after.Version() {
		t.Fatalf("refused rollbacks moved the set from %d to %d", after.Version(), now.Version())
	}
	for _, s := range now.Signers {
		if s.VersionID == v2 && s.State != Staged {
			t.Fatalf("%s is %s after a refused second rollback, want staged", v2, s.State)
		}
	}
	// What the list shows now is rolled back as it means: v2 discarded.
	if _, err := k.RollbackSeen(ctx, who, Seen{VersionID: v2, SetVersion: now.Version()}); err != nil {
		t.Fatalf("rollback on the new listing: %v", err)
	}
}
