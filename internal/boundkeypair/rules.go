package boundkeypair

import (
	"errors"
	"fmt"
	"time"
)

// Recovery modes (DESIGN.md): standard counts every recovery against the
// limit; relaxed does not count; insecure does not count and skips the
// join state check.
const (
	ModeStandard = "standard"
	ModeRelaxed  = "relaxed"
	ModeInsecure = "insecure"
)

// ValidMode reports whether m is a recovery mode.
func ValidMode(m string) bool { return m == ModeStandard || m == ModeRelaxed || m == ModeInsecure }

// Status is what the authority knows of a bound-keypair token when it
// judges a join.
type Status struct {
	Mode     string
	Limit    int64
	Count    int64
	Sequence int64  // 0 until the first join
	Epoch    string // the authority epoch of the token's last recovery
	// Created is the token's creation: a join state must be of this token,
	// not of a deleted one of the same name (JoinState.TokenCreated).
	Created time.Time
}

// Remaining is the recoveries left under standard mode (never negative);
// the other modes do not count.
func (s Status) Remaining() int64 { return max(s.Limit-s.Count, 0) }

// Epochs is what the authority's store knows of its epochs: each resync
// window an operator opens after restoring the store begins one. A join
// state document carries its token's epoch, so sequences compare within an
// epoch, and a document of an epoch the store does not know was signed
// after the backup the store was restored from.
type Epochs struct {
	// Current is the newest epoch ("" before any window was opened); a
	// recovery records it.
	Current string
	// WindowOpen: Current's window is open (by the store clock when read;
	// the write checks it again).
	WindowOpen bool
	// Ordinal is the order of every epoch the store knows; "" is 0.
	Ordinal map[string]int64
}

func (e Epochs) ordinal(id string) (int64, bool) {
	if id == "" {
		return 0, true
	}
	o, ok := e.Ordinal[id]
	return o, ok
}

// Attempt is one join after the challenge was solved with the bound key.
type Attempt struct {
	// Refresh: the caller holds a valid certificate of the token's current
	// instance. A refresh consumes nothing.
	Refresh bool
	// State is the verified join state document presented, nil if none
	// was; StateErr is why a presented one did not verify.
	State    *JoinState
	StateErr error
	// Rebind: the challenge was solved with the key State names, not the
	// token's, as MayRebind allowed: only a resync may follow, and it
	// rebinds the token to that key.
	Rebind bool
}

// Clean reports whether the attempt is a refresh presenting exactly the
// token's current join state: the one case Judge decides without Epochs.
func (a Attempt) Clean(st Status) bool {
	return a.Refresh && !a.Rebind && a.State != nil && a.State.Epoch == st.Epoch && a.State.RecoverySequence == st.Sequence
}

// Verdict is how a join goes on.
type Verdict struct {
	// Recovery: the join makes a new instance and moves the token from
	// (ExpectedSequence, ExpectedEpoch) to (Sequence, Epoch) (store.Recovery);
	// Counted takes one of the budget. Otherwise it is a refresh of the
	// current instance.
	Recovery         bool
	Counted          bool
	ExpectedSequence int64
	ExpectedEpoch    string
	Sequence         int64
	Epoch            string
	// Resync: a join state ahead of the restored store, accepted inside
	// Epoch's resync window: the token is brought forward to the
	// document's sequence + 1, and nothing is counted.
	Resync bool
	// Rebind: the resync also binds the key the join state names
	// (Attempt.Rebind).
	Rebind bool
}

// Refusals of Judge.
var (
	// ErrRecoveryExhausted: standard mode and the budget is spent.
	ErrRecoveryExhausted = errors.New("recovery_exhausted")
	// ErrJoinStateStale: the join state presented is older than the
	// token's: the keypair is in two places. The (node, token) pair is
	// locked and both holders refused.
	ErrJoinStateStale = errors.New("join_state_mismatch")
)

// Mismatch is a refused join state. Lock says the refusal must lock the
// (node, token) pair; Reason is for the audit record.
type Mismatch struct {
	Reason string
	Lock   bool
	// Ahead: the document is ahead of the store and no window admits it,
	// which is what a store restored from a backup looks like.
	Ahead bool
}

func (m *Mismatch) Error() string { return "join_state_mismatch: " + m.Reason }
func (m *Mismatch) Is(target error) bool {
	return target == ErrJoinStateInvalid || (m.Lock && target == ErrJoinStateStale)
}

// ResyncCommand opens a resync window as a refusal's way out: pasted as
// it is, it works (resync open refuses without --for and --reason), and
// the operator may shorten the window or name the backup.
const ResyncCommand = "muster bound-keypair resync open --for 24h --reason 'restored the store from a backup'"

// ResyncHint is what a refusal of a document ahead of the store tells the
// operator to do.
const ResyncHint = "if the store was restored from a backup, open a resync window: " + ResyncCommand

// Judge applies the recovery rules of st.Mode to one attempt whose
// challenge was solved; ep is needed unless a.Clean(st). The first join
// (sequence 0) needs no join state and counts as a recovery; later ones
// need the last document the authority signed (not in insecure mode).
//
// Within the token's epoch, a document older than the token's sequence is
// stale and locks. A newer one is what a store restored from an older
// backup sees (a restore moves the store back, never the agents): outside
// a resync window it is refused without a lock; inside one it is accepted
// once (Verdict.Resync), and the token enters the window's epoch. From
// then on every document of an earlier epoch, and every document of an
// epoch the store does not know, is a second holder's: stale, and it
// locks. So a window cannot launder a copied key: of the holders of
// pre-restore documents for one token, only the first is brought forward,
// and the next one to come locks the token as before the restore.
func Judge(st Status, a Attempt, ep Epochs) (Verdict, error) {
	if !ValidMode(st.Mode) {
		return Verdict{}, fmt.Errorf("boundkeypair: unknown recovery mode %q", st.Mode)
	}
	if a.Rebind {
		return judgeRebind(st, a, ep)
	}
	if st.Sequence > 0 && st.Mode != ModeInsecure {
		switch {
		case a.StateErr != nil:
			return Verdict{}, a.StateErr
		case a.State == nil:
			return Verdict{}, &Mismatch{Reason: "no join state presented"}
		}
		d := a.State
		if err := ofToken(st, d); err != nil {
			return Verdict{}, err
		}
		resync := false
		if d.Epoch != st.Epoch {
			if err := judgeEpoch(st, d, ep, false); err != nil {
				return Verdict{}, err
			}
			resync = true
		} else if d.RecoverySequence < st.Sequence {
			return Verdict{}, &Mismatch{Lock: true, Reason: fmt.Sprintf("join state at recovery sequence %d, the token is at %d",
				d.RecoverySequence, st.Sequence)}
		} else if d.RecoverySequence > st.Sequence {
			if err := judgeAhead(st, d, ep, false); err != nil {
				return Verdict{}, err
			}
			resync = true
		}
		if resync {
			return Verdict{Recovery: true, Resync: true, ExpectedSequence: st.Sequence, ExpectedEpoch: st.Epoch,
				Sequence: d.RecoverySequence + 1, Epoch: ep.Current}, nil
		}
	}
	if a.Refresh && st.Sequence > 0 {
		return Verdict{}, nil
	}
	v := Verdict{Recovery: true, ExpectedSequence: st.Sequence, ExpectedEpoch: st.Epoch, Sequence: st.Sequence + 1,
		Epoch: ep.Current, Counted: st.Mode == ModeStandard}
	if v.Counted && st.Count >= st.Limit {
		return Verdict{}, fmt.Errorf("%w: %d of %d recoveries used", ErrRecoveryExhausted, st.Count, st.Limit)
	}
	return v, nil
}

// ofToken refuses a document signed for an earlier token of st's name. A
// deleted token's documents verify for a new one of the same name (same
// authority, name and node), and its sequences mean nothing to the new
// one's: a copy of the old token's key, the one the way out of a stale
// join state leaves behind, would hold a document "ahead" of the new token
// (resynced in any window) or at its very sequence (a plain recovery). So
// no sequence is compared across tokens, and nothing is locked: the
// token's own holder is not the one refused. A document of this version
// names the token's creation; an older one only has its iat, which must
// not be before the creation's second (iat is in whole seconds), so only a
// namesake's document signed in the second the new token was made passes.
func ofToken(st Status, d *JoinState) error {
	if st.Created.IsZero() {
		return nil
	}
	created := st.Created.Truncate(time.Microsecond)
	switch {
	case !d.TokenCreated.IsZero() && !d.TokenCreated.Equal(created):
		return &Mismatch{Reason: fmt.Sprintf("join state of the token %s created %s, not of this one, created %s: a token of the same name deleted since; the holder of its bound key is not this token's",
			d.Token, d.TokenCreated.UTC().Format(time.RFC3339Nano), created.UTC().Format(time.RFC3339Nano))}
	case d.TokenCreated.IsZero() && d.IssuedAt.Before(created.Truncate(time.Second)):
		return &Mismatch{Reason: fmt.Sprintf("join state issued %s, before this token %s was created (%s): a document of a token of the same name deleted since; the holder of its bound key is not this token's",
			d.IssuedAt.UTC().Format(time.RFC3339), d.Token, created.UTC().Format(time.RFC3339Nano))}
	}
	return nil
}

// judgeEpoch judges a document of another epoch than its token's: nil
// means it is ahead of the store and may be resynced. rebind: see
// judgeAhead.
func judgeEpoch(st Status, d *JoinState, ep Epochs, rebind bool) error {
	dOrd, known := ep.ordinal(d.Epoch)
	tOrd, _ := ep.ordinal(st.Epoch)
	switch {
	case known && dOrd < tOrd:
		return &Mismatch{Lock: true, Reason: fmt.Sprintf("join state of epoch %q (sequence %d), before the token's epoch %q (sequence %d): another holder was recovered or resynced since",
			d.Epoch, d.RecoverySequence, st.Epoch, st.Sequence)}
	case known:
		return &Mismatch{Reason: fmt.Sprintf("join state of epoch %q, later than the token's epoch %q", d.Epoch, st.Epoch)}
	case st.Epoch == ep.Current && st.Epoch != "":
		// The token already entered the current epoch (resynced or
		// recovered in it): a second document from before the restore.
		return &Mismatch{Lock: true, Reason: fmt.Sprintf("join state of epoch %q, unknown to this store, after the token entered the current epoch %q: another holder was resynced or recovered since the restore",
			d.Epoch, st.Epoch)}
	}
	return judgeAhead(st, d, ep, rebind)
}

// judgeAhead judges a document ahead of its token (of its epoch, or of an
// epoch signed after the backup): nil inside a window the token has not
// been resynced in yet. rebind: the document names another key than the
// token's, signed after its last rotation (MayRebind), so it is ahead at
// the token's own sequence too.
func judgeAhead(st Status, d *JoinState, ep Epochs, rebind bool) error {
	switch {
	case d.RecoverySequence < st.Sequence || d.RecoverySequence == st.Sequence && !rebind:
		return &Mismatch{Reason: fmt.Sprintf("join state of epoch %q at recovery sequence %d, unknown to this store and not ahead of the token's %d",
			d.Epoch, d.RecoverySequence, st.Sequence)}
	case !ep.WindowOpen:
		return &Mismatch{Ahead: true, Reason: fmt.Sprintf("join state at recovery sequence %d is ahead of the token's %d (was the store restored from a backup?); %s",
			d.RecoverySequence, st.Sequence, ResyncHint)}
	case st.Epoch == ep.Current:
		return &Mismatch{Ahead: true, Reason: fmt.Sprintf("join state at recovery sequence %d is ahead of the token's %d in the current resync epoch %q: the store was restored again since the window opened; close it and open a new one: muster bound-keypair resync close, then %s",
			d.RecoverySequence, st.Sequence, st.Epoch, ResyncCommand)}
	}
	return nil
}

// RotationDue reports whether a token's bound key must be rotated at now:
// rotate_after is set and has passed, and the key was not rotated since
// (lastRotated before rotateAfter), so one rotation answers each
// rotate_after an operator sets.
func RotationDue(rotateAfter, lastRotated, now time.Time) bool {
	return !rotateAfter.IsZero() && !now.Before(rotateAfter) && lastRotated.Before(rotateAfter)
}
