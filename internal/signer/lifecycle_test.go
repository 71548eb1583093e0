package signer

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)

// TestStepTable walks every (action, state, trigger) at three clock
// readings and checks it against the legal edges listed here: anything not
// listed must be refused as illegal.
func TestStepTable(t *testing.T) {
	before, between, after := t0, t0.Add(90*time.Minute), t0.Add(3*time.Hour)
	type key struct {
		a    Action
		from State
		by   Trigger
		now  time.Time
	}
	legal := map[key]State{}
	allow := func(a Action, from, to State, by Trigger, nows ...time.Time) {
		for _, n := range nows {
			legal[key{a, from, by, n}] = to
		}
	}
	all := []time.Time{before, between, after}
	allow(ActCreate, none, Active, ByCommand, all...)
	allow(ActStage, none, Staged, ByCommand, all...)
	allow(ActActivate, Staged, Active, ByCommand, all...)
	allow(ActActivate, Staged, Active, ByClock, between, after) // effective at t0+1h
	allow(ActDemote, Active, Grace, ByCommand, all...)
	allow(ActRetire, Grace, Retired, ByCommand, all...)
	allow(ActRetire, Grace, Retired, ByClock, after) // retires at t0+2h
	for _, from := range []State{Staged, Active, Grace, Retired} {
		allow(ActRevoke, from, Revoked, ByCommand, all...)
	}
	allow(ActRollback, Staged, Retired, ByCommand, before)
	allow(ActRollback, Active, Staged, ByCommand, all...)
	allow(ActRestore, Grace, Active, ByCommand, before, between)

	notDue := map[key]bool{
		{ActActivate, Staged, ByClock, before}: true,
		{ActRetire, Grace, ByClock, before}:    true,
		{ActRetire, Grace, ByClock, between}:   true,
	}
	closed := map[key]bool{
		{ActRollback, Staged, ByCommand, between}: true,
		{ActRollback, Staged, ByCommand, after}:   true,
		{ActRestore, Grace, ByCommand, after}:     true,
	}

	actions := []Action{ActCreate, ActStage, ActActivate, ActDemote, ActRetire, ActRevoke, ActRollback, ActRestore}
	states := []State{none, Staged, Active, Grace, Retired, Revoked}
	for _, a := range actions {
		for _, from := range states {
			for _, by := range []Trigger{ByCommand, ByClock} {
				for _, now := range all {
					k := key{a, from, by, now}
					name := fmt.Sprintf("%s/%s/by%d/%s", a, from, by, now.Sub(t0))
					t.Run(name, func(t *testing.T) {
						s := Signer{VersionID: "v2", State: from, EffectiveAt: t0.Add(time.Hour), RetiresAt: t0.Add(2 * time.Hour)}
						got, err := Step(s, a, by, now)
						switch {
						case notDue[k]:
							if !errors.Is(err, ErrNotDue) {
								t.Fatalf("err = %v, want ErrNotDue", err)
							}
						case closed[k]:
							if !errors.Is(err, ErrRollbackClosed) {
								t.Fatalf("err = %v, want ErrRollbackClosed", err)
							}
						default:
							to, ok := legal[k]
							if !ok {
								var ie *IllegalError
								if !errors.As(err, &ie) {
									t.Fatalf("Step = %v, %v; want IllegalError", got.State, err)
								}
								return
							}
							if err != nil {
								t.Fatalf("Step: %v", err)
							}
							if got.State != to {
								t.Fatalf("state = %s, want %s", got.State, to)
							}
							if ended := to == Retired || to == Revoked; ended != got.EndedAt.Equal(now) {
								t.Fatalf("EndedAt = %v (ended %v)", got.EndedAt, ended)
							}
						}
					})
				}
			}
		}
	}
}

func newPub(t testing.TB) ed25519.PublicKey {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// apply writes a plan into a set of signers the way the store does: each
// change only if the signer is still in its From state.
func apply(t *testing.T, signers []Signer, changes []Change) []Signer {
	t.Helper()
	out := append([]Signer(nil), signers...)
	for _, c := range changes {
		found := c.From == none
		if found {
			out = append(out, c.To)
		}
		for i := range out {
			if c.From == none {
				break
			}
			if out[i].VersionID == c.To.VersionID {
				if out[i].State != c.From {
					t.Fatalf("change %s of %s expects %s, is %s", c.Action, c.To.VersionID, c.From, out[i].State)
				}
				out[i], found = c.To, true
			}
		}
		if !found {
			t.Fatalf("change of unknown %s", c.To.VersionID)
		}
		live := map[State]int{}
		for _, s := range out {
			if live[s.State]++; s.State.Trusted() && live[s.State] > 1 {
				t.Fatalf("after %s of %s: two signers %s", c.Action, c.To.VersionID, s.State)
			}
		}
	}
	return out
}

func states(signers []Signer) map[string]State {
	m := map[string]State{}
	for _, s := range signers {
		m[s.VersionID] = s.State
	}
	return m
}

// TestRotationAndRollback runs the seed's procedures on a clock: create,
// stage, activate by the clock, retire by the clock; a rollback before the
// effective time, one inside grace, and the refusal after grace.
func TestRotationAndRollback(t *testing.T) {
	const lead = DefaultMinLeadTime
	must := func(c []Change, err error) []Change {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	s := apply(t, nil, must(PlanCreate(nil, "v1", newPub(t), t0)))
	if _, err := PlanCreate(s, "v9", newPub(t), t0); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	eff, grace := t0.Add(time.Hour), t0.Add(25*time.Hour)

	t.Run("stage rules", func(t *testing.T) {
		for name, tc := range map[string]struct {
			eff, grace time.Time
		}{
			"inside lead time":    {t0.Add(lead - time.Second), grace},
			"grace before effect": {eff, eff.Add(-time.Minute)},
			"grace at effect":     {eff, eff},
		} {
			var te *TimesError
			if _, err := PlanStage(s, "v2", newPub(t), t0, tc.eff, tc.grace, lead); !errors.As(err, &te) {
				t.Errorf("%s: %v", name, err)
			}
		}
		if _, err := PlanStage(nil, "v2", newPub(t), t0, eff, grace, lead); !errors.Is(err, ErrNoActive) {
			t.Errorf("no active: %v", err)
		}
	})

	staged := apply(t, s, must(PlanStage(s, "v2", newPub(t), t0, eff, grace, lead)))
	if _, err := PlanStage(staged, "v3", newPub(t), t0, eff, grace, lead); !errors.Is(err, ErrStagedExists) {
		t.Fatalf("second stage: %v", err)
	}

	t.Run("rollback before effect discards", func(t *testing.T) {
		got := apply(t, staged, must(PlanRollback(staged, t0.Add(time.Minute), lead)))
		if diff := cmp.Diff(map[string]State{"v1": Active, "v2": Retired}, states(got)); diff != "" {
			t.Fatal(diff)
		}
	})

	if c, err := Due(staged, eff.Add(-time.Second)); err != nil || c != nil {
		t.Fatalf("due before effect: %v %v", c, err)
	}
	rotated := apply(t, staged, must(Due(staged, eff)))
	if diff := cmp.Diff(map[string]State{"v1": Grace, "v2": Active}, states(rotated)); diff != "" {
		t.Fatal(diff)
	}

	t.Run("rollback inside grace restores", func(t *testing.T) {
		now := eff.Add(time.Hour)
		got := apply(t, rotated, must(PlanRollback(rotated, now, lead)))
		if diff := cmp.Diff(map[string]State{"v1": Active, "v2": Staged}, states(got)); diff != "" {
			t.Fatal(diff)
		}
		for _, x := range got {
			if x.VersionID == "v2" && (!x.EffectiveAt.Equal(now.Add(lead)) || x.GraceLength() != grace.Sub(eff)) {
				t.Fatalf("re-issued times %v %v", x.EffectiveAt, x.GraceUntil)
			}
		}
	})

	if c, err := Due(rotated, grace.Add(-time.Second)); err != nil || c != nil {
		t.Fatalf("due before grace end: %v %v", c, err)
	}
	retired := apply(t, rotated, must(Due(rotated, grace)))
	if diff := cmp.Diff(map[string]State{"v1": Retired, "v2": Active}, states(retired)); diff != "" {
		t.Fatal(diff)
	}
	if _, err := PlanRollback(retired, grace.Add(time.Minute), lead); !errors.Is(err, ErrRollbackClosed) {
		t.Fatalf("rollback after grace: %v", err)
	}
	if _, err := PlanRollback(s, t0, lead); !errors.Is(err, ErrNoRotation) {
		t.Fatalf("rollback without rotation: %v", err)
	}

	t.Run("revoke active needs a successor", func(t *testing.T) {
		if _, err := PlanRevoke(s, "v1", t0); !errors.Is(err, ErrNoSuccessor) {
			t.Fatalf("revoke sole active: %v", err)
		}
		got := apply(t, staged, must(PlanRevoke(staged, "v1", t0)))
		if diff := cmp.Diff(map[string]State{"v1": Revoked, "v2": Active}, states(got)); diff != "" {
			t.Fatal(diff)
		}
	})
	t.Run("forced activation retires an older grace", func(t *testing.T) {
		again := apply(t, rotated, must(PlanStage(rotated, "v3", newPub(t), eff, eff.Add(time.Hour), eff.Add(2*time.Hour), lead)))
		got := apply(t, again, must(PlanActivate(again, ByCommand, eff.Add(time.Minute))))
		if diff := cmp.Diff(map[string]State{"v1": Retired, "v2": Grace, "v3": Active}, states(got)); diff != "" {
			t.Fatal(diff)
		}
	})
}

// TestGraceFromActivation checks that the predecessor's grace is the
// length asked at stage, counted from the real activation, whoever takes
// it and when, and that activate-and-rollback cycles never lengthen it: a
// forced activation used to keep the staged grace_until, and the rollback
// after it re-staged with the longer length it read.
func TestGraceFromActivation(t *testing.T) {
	const lead = DefaultMinLeadTime
	const asked = 24 * time.Hour
	eff := t0.Add(time.Hour)
	for name, tc := range map[string]struct {
		by  Trigger
		now time.Time
	}{
		"forced long before effect": {ByCommand, t0.Add(time.Minute)},
		"forced just before effect": {ByCommand, eff.Add(-time.Second)},
		"clock at effect":           {ByClock, eff},
		"clock after an outage":     {ByClock, eff.Add(30 * time.Hour)},
	} {
		t.Run(name, func(t *testing.T) {
			s := apply(t, nil, mustPlan(t)(PlanCreate(nil, "v1", newPub(t), t0)))
			s = apply(t, s, mustPlan(t)(PlanStage(s, "v2", newPub(t), t0, eff, eff.Add(asked), lead)))
			now, by := tc.now, tc.by
			for cycle := range 5 {
				s = apply(t, s, mustPlan(t)(PlanActivate(s, by, now)))
				for _, x := range s {
					if x.State == Grace && !x.RetiresAt.Equal(now.Add(asked)) {
						t.Fatalf("cycle %d: %s in grace until %v, want %v (activated %v + %v)", cycle, x.VersionID, x.RetiresAt, now.Add(asked), now, asked)
					}
					if x.State == Active && (!x.EffectiveAt.Equal(now) || x.GraceLength() != asked) {
						t.Fatalf("cycle %d: active %s effective %v grace %v, want %v and %v", cycle, x.VersionID, x.EffectiveAt, x.GraceLength(), now, asked)
					}
				}
				now = now.Add(time.Minute)
				s = apply(t, s, mustPlan(t)(PlanRollback(s, now, lead)))
				for _, x := range s {
					if x.State == Staged && (!x.EffectiveAt.Equal(now.Add(lead)) || x.GraceLength() != asked) {
						t.Fatalf("cycle %d: re-staged %s effective %v grace %v, want %v and %v", cycle, x.VersionID, x.EffectiveAt, x.GraceLength(), now.Add(lead), asked)
					}
				}
				// Alternate forced activations with the clock's, each a
				// little after the effective time it reads.
				by = ByCommand
				if cycle%2 == 1 {
					by, now = ByClock, now.Add(lead+time.Second)
				}
			}
		})
	}
	t.Run("emergency rotation", func(t *testing.T) {
		s := apply(t, nil, mustPlan(t)(PlanCreate(nil, "v1", newPub(t), t0)))
		s = apply(t, s, mustPlan(t)(PlanStage(s, "v2", newPub(t), t0, eff, eff.Add(asked), lead)))
		now := t0.Add(time.Minute)
		s = apply(t, s, mustPlan(t)(PlanRevoke(s, "v1", now)))
		if a, _ := ActiveOf(s); !a.EffectiveAt.Equal(now) || a.GraceLength() != asked {
			t.Fatalf("active %s effective %v grace %v, want %v and %v", a.VersionID, a.EffectiveAt, a.GraceLength(), now, asked)
		}
	})
}

func mustPlan(t *testing.T) func([]Change, error) []Change {
	return func(c []Change, err error) []Change {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

func TestNextVersionID(t *testing.T) {
	for want, in := range map[string][]Signer{
		"v1": nil,
		"v3": {{VersionID: "v2"}, {VersionID: "v1"}},
		"v8": {{VersionID: "v7"}, {VersionID: "x99"}, {VersionID: "v-1"}},
	} {
		if got := NextVersionID(in); got != want {
			t.Errorf("NextVersionID(%v) = %s, want %s", in, got, want)
		}
	}
}

// TestRefusalsNameTheWayOut: every refusal of a step the operator asked
// for names a command to run (they reach the terminal and the audit
// chain's reason as they are).
func TestRefusalsNameTheWayOut(t *testing.T) {
	const lead = DefaultMinLeadTime
	s := apply(t, nil, mustPlan(t)(PlanCreate(nil, "v1", newPub(t), t0)))
	staged := apply(t, s, mustPlan(t)(PlanStage(s, "v2", newPub(t), t0, t0.Add(time.Hour), t0.Add(2*time.Hour), lead)))
	active := apply(t, staged, mustPlan(t)(PlanActivate(staged, ByCommand, t0)))
	revoked := apply(t, active, mustPlan(t)(PlanRevoke(active, "v1", t0)))
	for name, err := range map[string]error{
		"revoke the only active signer": second(PlanRevoke(s, "v1", t0)),
		"roll back after grace":         second(PlanRollback(revoked, t0.Add(time.Minute), lead)),
		"revoke a revoked signer":       second(PlanRevoke(revoked, "v1", t0)),
	} {
		if err == nil || !strings.Contains(err.Error(), "(`muster signer ") {
			t.Errorf("%s: %v, want a refusal naming a muster signer command", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestRuleRefusalsNameTheWayOut: every refusal of a lifecycle rule an
// operator can meet names a muster signer command that gets past it
// (internal/cli's tests check that the commands parse). Before, "a staged
// signer exists; activate it or roll it back first" and "no rotation to
// roll back" named none (walked: a second stage through another replica).
func TestRuleRefusalsNameTheWayOut(t *testing.T) {
	for _, err := range []error{ErrStagedExists, ErrNoStaged, ErrNoSuccessor, ErrNoRotation} {
		if !IsRule(err) {
			t.Errorf("%v is not a rule refusal", err)
		}
		if !strings.Contains(err.Error(), "`muster signer ") {
			t.Errorf("%q names no muster signer command", err)
		}
	}
}
