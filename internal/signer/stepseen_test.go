package signer

import (
	"errors"
	"testing"
	"time"
)

// TestActivateAndRetireSeenAreTakenOnce: an activation or retirement
// asked on what one listing showed is refused, changing nothing, once
// the signers moved on (the clock activated the staged signer and
// another operator staged the next): it would otherwise activate a
// signer staged a moment ago, which agents may not hold yet, or retire
// the signer a later activation put in grace.
func TestActivateAndRetireSeenAreTakenOnce(t *testing.T) {
	ctx := t.Context()
	k, clock, _ := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops"}
	auto := Actor{Name: "authority"}
	if _, err := k.EnsureFirst(ctx, auto); err != nil {
		t.Fatal(err)
	}
	stage := func() string {
		t.Helper()
		res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return res.Changes[0].To.VersionID
	}
	load := func() Snapshot {
		t.Helper()
		s, err := k.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	stateOf := func(s Snapshot, id string) State {
		for _, x := range s.Signers {
			if x.VersionID == id {
				return x.State
			}
		}
		return ""
	}

	v2 := stage()
	seenActivate := Seen{VersionID: v2, SetVersion: load().Version()}
	// Meanwhile the clock activates v2 and another operator stages v3.
	clock.offset = time.Hour + time.Second
	if _, err := k.Tick(ctx, auto); err != nil {
		t.Fatal(err)
	}
	seenRetire := Seen{VersionID: "v1", SetVersion: load().Version()}
	v3 := stage()
	before := load()
	for _, seen := range []Seen{seenActivate, {SetVersion: seenActivate.SetVersion}} {
		if _, err := k.ActivateSeen(ctx, who, seen); !errors.Is(err, ErrChanged) {
			t.Fatalf("activate on %+v = %v, want ErrChanged", seen, err)
		}
	}
	if _, err := k.ActivateSeen(ctx, who, Seen{VersionID: v2}); !errors.Is(err, ErrNotThatRotation) || !IsRule(err) {
		t.Fatalf("activate naming %s with %s staged = %v, want ErrNotThatRotation", v2, v3, err)
	}
	if after := load(); after.Version() != before.Version() || stateOf(after, v3) != Staged {
		t.Fatalf("refused activations moved the set from %d to %d (%s %s)", before.Version(), after.Version(), v3, stateOf(after, v3))
	}

	// Retire: the operator saw v1 in grace; another activation since
	// retired it and put v2 in grace.
	if _, err := k.ActivateSeen(ctx, who, Seen{VersionID: v3, SetVersion: before.Version()}); err != nil {
		t.Fatalf("activate on the new listing: %v", err)
	}
	before = load()
	for _, seen := range []Seen{seenRetire, {SetVersion: seenRetire.SetVersion}} {
		if _, err := k.RetireSeen(ctx, who, seen); !errors.Is(err, ErrChanged) {
			t.Fatalf("retire on %+v = %v, want ErrChanged", seen, err)
		}
	}
	if _, err := k.RetireSeen(ctx, who, Seen{VersionID: "v1"}); !errors.Is(err, ErrNotThatRotation) {
		t.Fatalf("retire naming v1 with %s in grace = %v, want ErrNotThatRotation", v2, err)
	}
	if after := load(); after.Version() != before.Version() || stateOf(after, v2) != Grace {
		t.Fatalf("refused retirements moved the set from %d to %d (%s %s)", before.Version(), after.Version(), v2, stateOf(after, v2))
	}
	if _, err := k.RetireSeen(ctx, who, Seen{VersionID: v2, SetVersion: before.Version()}); err != nil {
		t.Fatalf("retire on the new listing: %v", err)
	}
	if s := stateOf(load(), v2); s != Retired {
		t.Fatalf("%s is %s after its retirement, want retired", v2, s)
	}
}
