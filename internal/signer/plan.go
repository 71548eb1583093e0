package signer

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"
)

// DefaultMinLeadTime is signer.min_lead_time's default: how far ahead of a
// rotate task's issue time the new signer may become effective, so that
// agents have time to receive it first.
const DefaultMinLeadTime = 10 * time.Minute

// MinGrace is the shortest grace a stage takes. A rotate task carries
// effective_at (a whole second) and grace_until in RFC 3339 seconds, so a
// shorter grace reads as grace_until equal to effective_at, which agents
// refuse (DESIGN.md: grace_until > effective_at).
const MinGrace = time.Second

// Change is one signer's part of a lifecycle step: the store writes To only
// if the signer is still in From (From == "" inserts To, refusing an
// existing version ID). A plan's changes are written together or not at all,
// in order, and ordered so that each frees its state before another change
// takes it: at most one signer is staged, active or in grace after every
// single write, which the store's unique index checks.
type Change struct {
	Action Action
	From   State
	To     Signer
}

// Errors of plans that look at the whole set of signers.
var (
	ErrExists       = errors.New("signer: a signer already exists; the first signer is created once")
	ErrNoActive     = errors.New("signer: no active signer")
	ErrStagedExists = errors.New("signer: a staged signer exists (`muster signer list` shows it); make it active now with `muster signer activate`, or discard it with `muster signer rollback` before its effective time, then stage again")
	ErrNotFound     = errors.New("signer: no such signer version")
	ErrNoStaged     = errors.New("signer: no staged signer: stage one first (`muster signer stage`)")
	// ErrNoSuccessor refuses to revoke the active signer while no staged
	// signer can take its place: nothing could sign the next verifier set.
	ErrNoSuccessor = errors.New("signer: the active signer can be revoked only while a staged signer exists to replace it; stage one first (`muster signer stage`), then revoke it")
	ErrNoRotation  = errors.New("signer: no rotation to roll back (no staged signer, and the active signer has no predecessor in grace); `muster signer list` shows the states, and `muster signer stage` starts a new rotation")
)

// TimesError is returned for stage times that break the rotation rules.
type TimesError struct{ Reason string }

func (e *TimesError) Error() string { return "signer: " + e.Reason }

func find(signers []Signer, pred func(Signer) bool) (Signer, bool) {
	for _, s := range signers {
		if pred(s) {
			return s, true
		}
	}
	return Signer{}, false
}

func inState(st State) func(Signer) bool { return func(s Signer) bool { return s.State == st } }

// ActiveOf returns the active signer.
func ActiveOf(signers []Signer) (Signer, bool) { return find(signers, inState(Active)) }

func byVersion(signers []Signer, id string) (Signer, error) {
	s, ok := find(signers, func(s Signer) bool { return s.VersionID == id })
	if !ok {
		return Signer{}, fmt.Errorf("%w: %s (`muster signer list` shows the versions)", ErrNotFound, id)
	}
	return s, nil
}

func step(s Signer, a Action, by Trigger, now time.Time) (Change, error) {
	to, err := Step(s, a, by, now)
	if err != nil {
		return Change{}, err
	}
	return Change{Action: a, From: s.State, To: to}, nil
}

// PlanCreate makes the first signer, active at once. It refuses when any
// signer exists, so init and an upgrade running on several replicas create
// one between them.
func PlanCreate(signers []Signer, versionID string, pub ed25519.PublicKey, now time.Time) ([]Change, error) {
	if len(signers) > 0 {
		return nil, ErrExists
	}
	s, err := newSigner(signers, versionID, pub, now)
	if err != nil {
		return nil, err
	}
	s.EffectiveAt = now
	c, err := step(s, ActCreate, ByCommand, now)
	return []Change{c}, err
}

// PlanStage publishes a new signer, to become active at effectiveAt, with
// the current active signer accepted until graceUntil.
func PlanStage(signers []Signer, versionID string, pub ed25519.PublicKey, now, effectiveAt, graceUntil time.Time, minLead time.Duration) ([]Change, error) {
	active, ok := ActiveOf(signers)
	if !ok {
		return nil, ErrNoActive
	}
	if _, ok := find(signers, inState(Staged)); ok {
		return nil, ErrStagedExists
	}
	if effectiveAt.Before(now.Add(minLead)) {
		return nil, &TimesError{Reason: fmt.Sprintf("effective time %s is less than the lead time %s away: stage it at least that far ahead (`muster signer stage --effective-in %s`), or lower signer.min_lead_time",
			effectiveAt.UTC().Format(time.RFC3339), minLead, minLead)}
	}
	if !graceUntil.After(effectiveAt) {
		return nil, &TimesError{Reason: "grace must end after the effective time"}
	}
	s, err := newSigner(signers, versionID, pub, now)
	if err != nil {
		return nil, err
	}
	s.EffectiveAt, s.GraceUntil, s.Previous = effectiveAt, graceUntil, active.VersionID
	c, err := step(s, ActStage, ByCommand, now)
	return []Change{c}, err
}

func newSigner(signers []Signer, versionID string, pub ed25519.PublicKey, now time.Time) (Signer, error) {
	if err := ValidVersionID(versionID); err != nil {
		return Signer{}, err
	}
	if _, err := byVersion(signers, versionID); err == nil {
		return Signer{}, fmt.Errorf("signer: version %s exists", versionID)
	}
	if len(pub) != ed25519.PublicKeySize {
		return Signer{}, errors.New("signer: public key is not Ed25519")
	}
	return Signer{VersionID: versionID, PublicKey: pub, PublishedAt: now}, nil
}

// activated dates a signer's activation now: its grace, the length the
// operator asked for at stage (Signer.GraceLength), runs from the real
// activation, not from the effective time it was staged with. Keeping the
// staged GraceUntil on a forced activation gave the predecessor a longer
// grace than asked, and a rollback, which re-stages with the length it
// reads, made it longer still on every activate-and-rollback cycle.
func activated(s Signer, now time.Time) Signer {
	s.GraceUntil = now.Add(s.GraceLength())
	s.EffectiveAt = now
	return s
}

// PlanActivate makes the staged signer active: by the clock at its
// effective time, by a command at once. The active signer moves to grace
// for the grace length asked at stage, counted from now, and a signer
// still in grace from an earlier rotation retires, so at most one is in
// grace.
func PlanActivate(signers []Signer, by Trigger, now time.Time) ([]Change, error) {
	staged, ok := find(signers, inState(Staged))
	if !ok {
		return nil, ErrNoStaged
	}
	up, err := step(staged, ActActivate, by, now)
	if err != nil {
		return nil, err
	}
	up.To = activated(up.To, now)
	// Each change frees its slot before the next takes it: the store holds
	// at most one staged, one active and one in grace at every write.
	var changes []Change
	if old, ok := find(signers, inState(Grace)); ok {
		c, err := step(old, ActRetire, ByCommand, now)
		if err != nil {
			return nil, err
		}
		changes = append(changes, c)
	}
	if active, ok := ActiveOf(signers); ok {
		c, err := step(active, ActDemote, ByCommand, now)
		if err != nil {
			return nil, err
		}
		c.To.RetiresAt = up.To.GraceUntil
		changes = append(changes, c)
	}
	return append(changes, up), nil
}

// PlanRetire retires the signer in grace: by the clock when its grace has
// ended, by a command at once.
func PlanRetire(signers []Signer, by Trigger, now time.Time) ([]Change, error) {
	old, ok := find(signers, inState(Grace))
	if !ok {
		return nil, fmt.Errorf("%w in grace: a signer is in grace from its successor's activation until its grace ends (`muster signer list` shows the states)", ErrNotFound)
	}
	c, err := step(old, ActRetire, by, now)
	if err != nil {
		return nil, err
	}
	return []Change{c}, nil
}

// PlanRevoke distrusts one signer at once. Revoking the active signer is an
// emergency rotation: the staged signer becomes active in the same step,
// and agents that do not yet hold it cannot verify new tasks until they
// reconnect and receive the new verifier set.
func PlanRevoke(signers []Signer, versionID string, now time.Time) ([]Change, error) {
	s, err := byVersion(signers, versionID)
	if err != nil {
		return nil, err
	}
	c, err := step(s, ActRevoke, ByCommand, now)
	if err != nil {
		return nil, err
	}
	if s.State != Active {
		return []Change{c}, nil
	}
	staged, ok := find(signers, inState(Staged))
	if !ok {
		return nil, ErrNoSuccessor
	}
	up, err := step(staged, ActActivate, ByCommand, now)
	if err != nil {
		return nil, err
	}
	up.To = activated(up.To, now)
	return []Change{c, up}, nil
}

// PlanRollback undoes the rotation in progress, by the seed's rules: before
// the staged signer's effective time it is discarded; after, within the
// predecessor's grace, the predecessor signs again and the new signer is
// staged again with its rollout re-issued (effective minLead from now, with
// the grace length asked at stage: activation keeps it, so it does not
// grow over activate-and-rollback cycles); after grace, ErrRollbackClosed.
func PlanRollback(signers []Signer, now time.Time, minLead time.Duration) ([]Change, error) {
	if staged, ok := find(signers, inState(Staged)); ok {
		c, err := step(staged, ActRollback, ByCommand, now)
		if err != nil {
			return nil, err
		}
		return []Change{c}, nil
	}
	active, ok := ActiveOf(signers)
	if !ok {
		return nil, ErrNoActive
	}
	prev, ok := find(signers, func(s Signer) bool { return s.State == Grace && s.VersionID == active.Previous })
	if !ok {
		if active.Previous != "" {
			return nil, ErrRollbackClosed
		}
		return nil, ErrNoRotation
	}
	restore, err := step(prev, ActRestore, ByCommand, now)
	if err != nil {
		return nil, err
	}
	restore.To.RetiresAt = time.Time{}
	back, err := step(active, ActRollback, ByCommand, now)
	if err != nil {
		return nil, err
	}
	back.To.EffectiveAt = wholeSecond(now.Add(minLead))
	back.To.GraceUntil = back.To.EffectiveAt.Add(active.GraceLength())
	return []Change{back, restore}, nil
}

// Due returns the plan the clock takes now: an activation whose time has
// come, else a retirement whose grace has ended, else nothing.
func Due(signers []Signer, now time.Time) ([]Change, error) {
	for _, plan := range []func() ([]Change, error){
		func() ([]Change, error) { return PlanActivate(signers, ByClock, now) },
		func() ([]Change, error) { return PlanRetire(signers, ByClock, now) },
	} {
		changes, err := plan()
		if err == nil {
			return changes, nil
		}
		if !errors.Is(err, ErrNotDue) && !errors.Is(err, ErrNoStaged) && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}
	return nil, nil
}
