package signer

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestRevokeSeenIsTakenOnce: revoking the active signer also activates
// the staged one, so a revoke asked on what one listing showed is refused,
// changing nothing, once the staged signer is another (the one seen rolled
// back and a new one staged by another operator): it would otherwise
// activate a signer the operator never saw. Asked without a version (an
// older client) it revokes on the current set, as before.
func TestRevokeSeenIsTakenOnce(t *testing.T) {
	ctx := t.Context()
	k, _, _ := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, Actor{Name: "authority"}); err != nil {
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
	seen := Seen{VersionID: "v1", SetVersion: load().Version()}
	// Meanwhile another operator rolls v2 back and stages v3.
	if _, err := k.Rollback(ctx, who); err != nil {
		t.Fatal(err)
	}
	v3 := stage()
	before := load()
	_, err := k.RevokeSeen(ctx, who, seen)
	if !errors.Is(err, ErrChanged) {
		t.Fatalf("revoke of v1 seen with %s staged, now %s = %v, want ErrChanged", v2, v3, err)
	}
	if !strings.Contains(err.Error(), "`muster signer revoke v1`") {
		t.Errorf("refusal %q does not name the command to run again", err)
	}
	if after := load(); after.Version() != before.Version() || stateOf(after, "v1") != Active || stateOf(after, v3) != Staged {
		t.Fatalf("refused revoke moved the set from %d to %d (v1 %s, %s %s)", before.Version(), after.Version(), stateOf(after, "v1"), v3, stateOf(after, v3))
	}

	// Asked on the new listing, it is taken: v3 is the one seen.
	if _, err := k.RevokeSeen(ctx, who, Seen{VersionID: "v1", SetVersion: before.Version()}); err != nil {
		t.Fatalf("revoke on the new listing: %v", err)
	}
	after := load()
	if stateOf(after, "v1") != Revoked || stateOf(after, v3) != Active {
		t.Fatalf("after the revoke v1 is %s and %s %s, want revoked and active", stateOf(after, "v1"), v3, stateOf(after, v3))
	}

	// An older client names no version: the revoke is taken on the
	// current set.
	v4 := stage()
	if _, err := k.Revoke(ctx, who, v4); err != nil {
		t.Fatalf("revoke without a set version: %v", err)
	}
	if s := stateOf(load(), v4); s != Revoked {
		t.Fatalf("%s is %s after its revoke, want revoked", v4, s)
	}
}
