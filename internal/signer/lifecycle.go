package signer

import (
	"errors"
	"fmt"
	"time"
)

// Action names a lifecycle step. The operator-facing ones are also audit
// actions (node_task_signer.<action>); demote and restore happen only as
// the other half of an activation or a rollback.
type Action string

const (
	ActCreate   Action = "create"
	ActStage    Action = "stage"
	ActActivate Action = "activate"
	ActRetire   Action = "retire"
	ActRevoke   Action = "revoke"
	ActRollback Action = "rollback"
	// ActDemote moves the active signer to grace when its successor is
	// activated.
	ActDemote Action = "demote"
	// ActRestore brings a signer in grace back to active in a rollback.
	ActRestore Action = "restore"
)

// Trigger says who asks for a step: an operator's command forces it, the
// clock (the leader's job) takes it only when it is due.
type Trigger int

const (
	ByCommand Trigger = iota
	ByClock
)

// none is the "from" state of a signer that does not exist yet.
const none State = ""

// transition is one legal edge. due, when set, says when the clock takes
// it by itself (an edge without due is never taken by the clock); guard,
// when set, must hold whoever asks.
type transition struct {
	action   Action
	from, to State
	due      func(s Signer, now time.Time) bool
	guard    func(s Signer, now time.Time) error
}

// ErrRollbackClosed is returned for a rollback after the grace window: the
// old key may not be reused silently, only by a new rotation.
var ErrRollbackClosed = errors.New("signer: rollback is possible only before the staged signer's effective time or within the previous signer's grace; after grace, stage a new signer (`muster signer stage`)")

// transitions is the whole lifecycle: every (action, from) pair not listed
// is illegal. docs/signer-lifecycle.md draws the same graph.
var transitions = []transition{
	{action: ActCreate, from: none, to: Active},
	{action: ActStage, from: none, to: Staged},
	{action: ActActivate, from: Staged, to: Active,
		due: func(s Signer, now time.Time) bool { return !now.Before(s.EffectiveAt) }},
	{action: ActDemote, from: Active, to: Grace},
	{action: ActRetire, from: Grace, to: Retired,
		due: func(s Signer, now time.Time) bool { return !now.Before(s.RetiresAt) }},
	{action: ActRevoke, from: Staged, to: Revoked},
	{action: ActRevoke, from: Active, to: Revoked},
	{action: ActRevoke, from: Grace, to: Revoked},
	{action: ActRevoke, from: Retired, to: Revoked},
	// Rollback before effective_at discards the staged signer.
	{action: ActRollback, from: Staged, to: Retired,
		guard: func(s Signer, now time.Time) error {
			if !now.Before(s.EffectiveAt) {
				return ErrRollbackClosed
			}
			return nil
		}},
	// Rollback inside the predecessor's grace puts the new signer back to
	// staged (its rollout is re-issued); the predecessor is restored.
	{action: ActRollback, from: Active, to: Staged},
	{action: ActRestore, from: Grace, to: Active,
		guard: func(s Signer, now time.Time) error {
			if !now.Before(s.RetiresAt) {
				return ErrRollbackClosed
			}
			return nil
		}},
}

// IllegalError is returned for a step the table does not allow.
type IllegalError struct {
	VersionID string
	Action    Action
	From      State
}

func (e *IllegalError) Error() string {
	from := string(e.From)
	if from == "" {
		from = "nonexistent"
	}
	return fmt.Sprintf("signer: cannot %s signer %s in state %s (`muster signer list` shows the states)", e.Action, e.VersionID, from)
}

// ErrNotDue is returned when the clock asks for a step whose time has not
// come; the command may still force it.
var ErrNotDue = errors.New("signer: not due yet")

// Step applies one action to one signer by the table, stamping EndedAt on
// the way to retired or revoked. It does not look at other signers; Plan
// does.
func Step(s Signer, a Action, by Trigger, now time.Time) (Signer, error) {
	for _, t := range transitions {
		if t.action != a || t.from != s.State {
			continue
		}
		if by == ByClock {
			if t.due == nil {
				return Signer{}, &IllegalError{VersionID: s.VersionID, Action: a, From: s.State}
			}
			if !t.due(s, now) {
				return Signer{}, ErrNotDue
			}
		}
		if t.guard != nil {
			if err := t.guard(s, now); err != nil {
				return Signer{}, err
			}
		}
		s.State = t.to
		if t.to == Retired || t.to == Revoked {
			s.EndedAt = now
		}
		return s, nil
	}
	return Signer{}, &IllegalError{VersionID: s.VersionID, Action: a, From: s.State}
}
