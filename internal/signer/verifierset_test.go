package signer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/seal"
)

// fleet is an authority's signers with their custody, for tests.
type fleet struct {
	t       testing.TB
	custody *Sealed
	refs    map[string][]byte
	signers []Signer
	version int64
	// prev is the states of the set before the last step, which choose
	// its signer (Signing).
	prev map[string]State
}

func newFleet(t testing.TB) *fleet {
	c, err := NewSealed(seal.StorageKey{7})
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, custody: c, refs: map[string][]byte{}}
}

func (f *fleet) key(id string) Key {
	k, err := f.custody.Generate(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	f.refs[id] = k.Ref
	return k
}

func (f *fleet) apply(changes []Change, err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
	f.prev = map[string]State{}
	for _, s := range f.signers {
		f.prev[s.VersionID] = s.State
	}
	if len(f.signers) == 0 {
		f.prev = nil
	}
	for _, c := range changes {
		replaced := false
		for i := range f.signers {
			if f.signers[i].VersionID == c.To.VersionID {
				f.signers[i], replaced = c.To, true
			}
		}
		if !replaced {
			f.signers = append(f.signers, c.To)
		}
	}
	f.version++
}

// set returns the current verifier set, signed as the keeper signs it.
func (f *fleet) set(now time.Time) []byte {
	f.t.Helper()
	by, err := Signing(f.prev, f.signers)
	if err != nil {
		f.t.Fatal(err)
	}
	raw, err := NewVerifierSet("prod-a3f2e1", f.version, f.signers, now, DefaultMinLeadTime).Sign(by.VersionID, func(msg []byte) ([]byte, error) {
		return f.custody.Sign(context.Background(), by.VersionID, by.PublicKey, f.refs[by.VersionID], msg)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return raw
}

func TestVerifierSetRoundTrip(t *testing.T) {
	f := newFleet(t)
	f.apply(PlanCreate(nil, "v1", f.key("v1").Public, t0))
	f.apply(PlanStage(f.signers, "v2", f.key("v2").Public, t0, t0.Add(time.Hour), t0.Add(2*time.Hour), DefaultMinLeadTime))
	raw := f.set(t0)
	v, err := ParseVerifierSet(raw)
	if err != nil {
		t.Fatal(err)
	}
	if v.Version != 2 || len(v.Keys) != 2 {
		t.Fatalf("set = %+v", v)
	}
	if k, _ := v.Key("v2"); k.State != Staged || !k.EffectiveAt.Equal(t0.Add(time.Hour)) || k.Previous != "v1" {
		t.Fatalf("staged key = %+v", k)
	}
}

func TestVerifierSetRefusals(t *testing.T) {
	f := newFleet(t)
	f.apply(PlanCreate(nil, "v1", f.key("v1").Public, t0))
	good := f.set(t0)
	var w signedSet
	if err := json.Unmarshal(good, &w); err != nil {
		t.Fatal(err)
	}
	edit := func(fn func(*signedSet, map[string]any)) []byte {
		c := w
		var set map[string]any
		if err := json.Unmarshal(w.Set, &set); err != nil {
			t.Fatal(err)
		}
		fn(&c, set)
		c.Set, _ = json.Marshal(set)
		out, _ := json.Marshal(c)
		return out
	}
	for name, tc := range map[string]struct {
		raw  []byte
		want error
	}{
		"too large":      {append(good, make([]byte, MaxSetBytes)...), ErrSetMalformed},
		"trailing":       {append(append([]byte(nil), good...), "{}"...), ErrSetMalformed},
		"unknown field":  {edit(func(_ *signedSet, s map[string]any) { s["extra"] = 1 }), ErrSetMalformed},
		"wrong type":     {edit(func(_ *signedSet, s map[string]any) { s["type"] = "muster-task" }), ErrSetMalformed},
		"zero version":   {edit(func(_ *signedSet, s map[string]any) { s["version"] = 0 }), ErrSetMalformed},
		"no active key":  {edit(func(_ *signedSet, s map[string]any) { s["keys"] = []any{} }), ErrSetMalformed},
		"other signer":   {edit(func(w *signedSet, _ map[string]any) { w.SignerVersionID = "v9" }), ErrSetMalformed},
		"bad signature":  {edit(func(w *signedSet, _ map[string]any) { w.Signature = strings.Repeat("A", 86) }), ErrSetSignature},
		"short sig":      {edit(func(w *signedSet, _ map[string]any) { w.Signature = "AAAA" }), ErrSetMalformed},
		"edited version": {edit(func(_ *signedSet, s map[string]any) { s["version"] = 5 }), ErrSetSignature},
	} {
		if _, err := ParseVerifierSet(tc.raw); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

// TestTrustFollowsRotation is what an agent sees through a rotation: it
// learns the staged key, accepts the set the new key signs, keeps the old
// key until grace ends, refuses stale sets and sets signed by a key it does
// not trust as active, and an agent that missed every set still switches by
// the times it holds.
func TestTrustFollowsRotation(t *testing.T) {
	f := newFleet(t)
	f.apply(PlanCreate(nil, "v1", f.key("v1").Public, t0))
	first := f.set(t0)
	tr, err := NewTrust(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Accept(first, t0); err != nil {
		t.Fatal(err)
	}
	eff, grace := t0.Add(time.Hour), t0.Add(3*time.Hour)
	f.apply(PlanStage(f.signers, "v2", f.key("v2").Public, t0, eff, grace, DefaultMinLeadTime))
	v2 := f.signers[1]
	if err := tr.AddStaged(SetKey{VersionID: "v2", PublicKey: EncodePublicKey(v2.PublicKey), EffectiveAt: eff, GraceUntil: grace, Previous: "v1"}); err != nil {
		t.Fatal(err)
	}
	if err := tr.AddStaged(SetKey{VersionID: "v2", PublicKey: EncodePublicKey(newPub(t))}); !errors.Is(err, ErrKeyConflict) {
		t.Fatalf("conflicting key: %v", err)
	}
	// An offline agent holding only the first set and the staged key.
	offline, _ := NewTrust(tr.Raw(), tr.Pending())

	for _, tc := range []struct {
		at     time.Time
		v1, v2 State
	}{
		{t0, Active, Staged},
		{eff.Add(-Skew), Active, Staged},
		{eff, Grace, Active},
		{grace, Grace, Active},
		{grace.Add(Skew + time.Second), Retired, Active},
	} {
		for id, want := range map[string]State{"v1": tc.v1, "v2": tc.v2} {
			if _, got, _ := offline.StateAt(id, tc.at); got != want {
				t.Errorf("at %s: %s is %s, want %s", tc.at.Sub(t0), id, got, want)
			}
		}
	}
	if _, _, ok := offline.Verifier("v1", grace.Add(time.Hour)); ok {
		t.Error("old key accepted after grace")
	}

	stale := f.set(t0) // version 2, signed by v1, still active at the authority
	f.apply(PlanActivate(f.signers, ByClock, eff))
	rotated := f.set(eff)
	// Signed by v2, which the agent holds as staged: taken, whatever the
	// clock says (a forced activation comes before the effective time).
	if err := tr.Accept(rotated, t0); err != nil {
		t.Fatalf("rotated set: %v", err)
	}
	if len(tr.Pending()) != 0 || tr.Version() != 3 {
		t.Fatalf("pending %v version %d", tr.Pending(), tr.Version())
	}
	if err := tr.Accept(stale, eff); !errors.Is(err, ErrSetStale) {
		t.Fatalf("stale set: %v", err)
	}
	if got := tr.Accepted(eff); got["v1"] != Grace || got["v2"] != Active {
		t.Fatalf("accepted = %v", got)
	}

	// A set signed by a stranger's active key is refused by a trusting agent.
	g := newFleet(t)
	g.apply(PlanCreate(nil, "v1", g.key("v1").Public, t0))
	g.version = 10
	if err := tr.Accept(g.set(eff), eff); !errors.Is(err, ErrSetUntrusted) {
		t.Fatalf("foreign set: %v", err)
	}
	// Signed by a key the agent does not hold: refused.
	h := newFleet(t)
	h.apply(PlanCreate(nil, "v9", h.key("v9").Public, t0))
	h.version = 11
	if err := tr.Accept(h.set(eff), eff); !errors.Is(err, ErrSetUntrusted) {
		t.Fatalf("set signed by a key the agent does not hold: %v", err)
	}
}

func TestParseStaticKeys(t *testing.T) {
	a, b := EncodePublicKey(newPub(t)), EncodePublicKey(newPub(t))
	keys, err := ParseStaticKeys(a + ", " + b + "\n")
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys %d, %v", len(keys), err)
	}
	if _, err := ParseStaticKeys(a + ",nope"); err == nil || strings.Contains(err.Error(), a) {
		t.Fatalf("bad entry: %v", err)
	}
}

func FuzzParseVerifierSet(f *testing.F) {
	fl := newFleet(f)
	fl.apply(PlanCreate(nil, "v1", fl.key("v1").Public, t0))
	f.Add(fl.set(t0))
	f.Add([]byte(`{"set":{},"signer_version_id":"v1","signature":""}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ParseVerifierSet(data)
		if err != nil {
			return
		}
		if err := v.check(); err != nil {
			t.Fatalf("accepted a set that fails its own check: %v", err)
		}
		if _, ok := v.Active(); !ok {
			t.Fatal("accepted a set without an active key")
		}
	})
}

// TestSigningKeepsEveryAgent: for each step, the set it makes is signed by
// a key the previous set holds as active or staged, never by the key the
// step ended, and an agent holding the previous set takes it.
func TestSigningKeepsEveryAgent(t *testing.T) {
	eff, grace := t0.Add(time.Hour), t0.Add(3*time.Hour)
	for _, tc := range []struct {
		name string
		step func(f *fleet)
		by   string
	}{
		{"stage", func(f *fleet) {}, "v1"},
		{"forced activation", func(f *fleet) { f.apply(PlanActivate(f.signers, ByCommand, t0)) }, "v2"},
		{"revoke the active key with a staged successor", func(f *fleet) { f.apply(PlanRevoke(f.signers, "v1", t0)) }, "v2"},
		{"revoke the staged key", func(f *fleet) { f.apply(PlanRevoke(f.signers, "v2", t0)) }, "v1"},
		{"rollback before effective_at", func(f *fleet) { f.apply(PlanRollback(f.signers, t0, DefaultMinLeadTime)) }, "v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t)
			f.apply(PlanCreate(nil, "v1", f.key("v1").Public, t0))
			agent, _ := NewTrust(nil, nil)
			if err := agent.Accept(f.set(t0), t0); err != nil {
				t.Fatal(err)
			}
			f.apply(PlanStage(f.signers, "v2", f.key("v2").Public, t0, eff, grace, DefaultMinLeadTime))
			if tc.name != "stage" {
				if err := agent.Accept(f.set(t0), t0); err != nil {
					t.Fatal(err)
				}
				tc.step(f)
			}
			raw := f.set(t0)
			var w signedSet
			if err := json.Unmarshal(raw, &w); err != nil || w.SignerVersionID != tc.by {
				t.Fatalf("signed by %s, want %s (%v)", w.SignerVersionID, tc.by, err)
			}
			// Long after the effective time, by the agent's clock.
			if err := agent.Accept(raw, grace.Add(time.Hour)); err != nil {
				t.Fatalf("an agent holding the previous set refuses it: %v", err)
			}
		})
	}
	// Inside grace, the rollback's set is signed by the key that was
	// active (staged again), not the restored one, which agents hold in
	// grace.
	f := newFleet(t)
	f.apply(PlanCreate(nil, "v1", f.key("v1").Public, t0))
	f.apply(PlanStage(f.signers, "v2", f.key("v2").Public, t0, eff, grace, DefaultMinLeadTime))
	f.apply(PlanActivate(f.signers, ByClock, eff))
	agent, _ := NewTrust(f.set(eff), nil)
	f.apply(PlanRollback(f.signers, eff.Add(time.Minute), DefaultMinLeadTime))
	if err := agent.Accept(f.set(eff), eff.Add(time.Minute)); err != nil {
		t.Fatalf("rollback inside grace: %v", err)
	}
	// A set may not be signed by a key it does not hold as active or
	// staged.
	if _, err := NewVerifierSet("a", 9, f.signers, t0, 0).Sign("v9", nil); err == nil {
		t.Fatal("signed by a key not in the set")
	}
}

// TestSetCarriesMinLeadTime: agents read signer.min_lead_time from the
// set, and the default from a set that does not say.
func TestSetCarriesMinLeadTime(t *testing.T) {
	f := newFleet(t)
	f.apply(PlanCreate(nil, "v1", f.key("v1").Public, t0))
	by, _ := Signing(nil, f.signers)
	for _, lead := range []time.Duration{time.Minute, 0} {
		raw, err := NewVerifierSet("a", 1, f.signers, t0, lead).Sign("v1", func(msg []byte) ([]byte, error) {
			return f.custody.Sign(context.Background(), "v1", by.PublicKey, f.refs["v1"], msg)
		})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewTrust(raw, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := lead
		if lead == 0 {
			want = DefaultMinLeadTime
		}
		if got := tr.MinLeadTime(); got != want {
			t.Errorf("set with lead %s: agent applies %s", lead, got)
		}
	}
}

// TestSetStaysBounded: after more rotations than a set holds keys, the set
// keeps the live keys and the most recently ended ones, and still signs.
func TestSetStaysBounded(t *testing.T) {
	f := newFleet(t)
	f.apply(PlanCreate(nil, "v1", f.key("v1").Public, t0))
	now := t0
	for i := 2; i <= MaxSetKeys+5; i++ {
		id := fmt.Sprintf("v%d", i)
		f.apply(PlanStage(f.signers, id, f.key(id).Public, now, now.Add(time.Hour), now.Add(2*time.Hour), DefaultMinLeadTime))
		now = now.Add(time.Hour)
		f.apply(PlanActivate(f.signers, ByClock, now))
	}
	v, err := ParseVerifierSet(f.set(now))
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Keys) != MaxSetKeys {
		t.Fatalf("%d keys, want %d", len(v.Keys), MaxSetKeys)
	}
	if _, ok := v.Key("v1"); ok {
		t.Fatal("the oldest retired key was kept")
	}
	if a, _ := v.Active(); a.VersionID != fmt.Sprintf("v%d", MaxSetKeys+5) {
		t.Fatalf("active %s", a.VersionID)
	}
}

// TestPendingKeyDroppedByALaterSet: a staged key learnt from a rotate
// task and absent from a set issued after that task is dropped (the
// authority discarded it and pruned it, or lost it with a restored
// backup); a set issued before the task leaves it pending.
func TestPendingKeyDroppedByALaterSet(t *testing.T) {
	f := newFleet(t)
	f.apply(PlanCreate(nil, "v1", f.key("v1").Public, t0))
	tr, _ := NewTrust(nil, nil)
	if err := tr.Accept(f.set(t0), t0); err != nil {
		t.Fatal(err)
	}
	v1 := f.signers[0]
	setAt := func(version int64, at time.Time) []byte {
		raw, err := NewVerifierSet("prod-a3f2e1", version, []Signer{v1}, at, DefaultMinLeadTime).Sign("v1", func(msg []byte) ([]byte, error) {
			return f.custody.Sign(context.Background(), "v1", v1.PublicKey, f.refs["v1"], msg)
		})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	issued := t0.Add(time.Minute) // the rotate task's issue time
	eff := issued.Add(time.Hour)
	if err := tr.AddStaged(SetKey{VersionID: "v2-3fa9c2d1", PublicKey: EncodePublicKey(newPub(t)), PublishedAt: issued,
		EffectiveAt: eff, GraceUntil: eff.Add(time.Hour), Previous: "v1"}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Accept(setAt(2, issued.Add(-time.Second)), issued); err != nil {
		t.Fatal(err)
	}
	if len(tr.Pending()) != 1 {
		t.Fatalf("a set issued before the rotate task dropped its key: pending %v", tr.Pending())
	}
	if err := tr.Accept(setAt(5, issued.Add(time.Second)), issued); err != nil {
		t.Fatal(err)
	}
	if len(tr.Pending()) != 0 {
		t.Fatalf("a set issued after the rotate task, without its key, kept it: pending %v", tr.Pending())
	}
	if _, _, ok := tr.Verifier("v2-3fa9c2d1", issued); ok {
		t.Fatal("the dropped key still verifies tasks")
	}
}
