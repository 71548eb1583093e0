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
	Sequence int64 // 0 until the first join
}

// Remaining is the recoveries left under standard mode (never negative);
// the other modes do not count.
func (s Status) Remaining() int64 { return max(s.Limit-s.Count, 0) }

// Attempt is one join after the challenge was solved with the bound key.
type Attempt struct {
	// Refresh: the caller holds a valid certificate of the token's current
	// instance. A refresh consumes nothing.
	Refresh bool
	// State is the verified join state document presented, nil if none
	// was; StateErr is why a presented one did not verify.
	State    *JoinState
	StateErr error
}

// Verdict is how a join goes on.
type Verdict struct {
	// Recovery: the join makes a new instance and advances the sequence
	// from ExpectedSequence (store.Recovery); Counted takes one of the
	// budget. Otherwise it is a refresh of the current instance.
	Recovery         bool
	Counted          bool
	ExpectedSequence int64
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
}

func (m *Mismatch) Error() string { return "join_state_mismatch: " + m.Reason }
func (m *Mismatch) Is(target error) bool {
	return target == ErrJoinStateInvalid || (m.Lock && target == ErrJoinStateStale)
}

// Judge applies the recovery rules of st.Mode to one attempt whose
// challenge was solved. The first join (sequence 0) needs no join state and
// counts as a recovery; later ones need the last document the authority
// signed (not in insecure mode). A document older than the token's
// sequence is stale and locks; a newer one (the authority's store was
// restored from an older backup) or a missing or forged one is refused
// without a lock, so a restore never locks every bound agent by itself.
func Judge(st Status, a Attempt) (Verdict, error) {
	if !ValidMode(st.Mode) {
		return Verdict{}, fmt.Errorf("boundkeypair: unknown recovery mode %q", st.Mode)
	}
	if st.Sequence > 0 && st.Mode != ModeInsecure {
		switch {
		case a.StateErr != nil:
			return Verdict{}, a.StateErr
		case a.State == nil:
			return Verdict{}, &Mismatch{Reason: "no join state presented"}
		case a.State.RecoverySequence < st.Sequence:
			return Verdict{}, &Mismatch{Lock: true, Reason: fmt.Sprintf("join state at recovery sequence %d, the token is at %d",
				a.State.RecoverySequence, st.Sequence)}
		case a.State.RecoverySequence > st.Sequence:
			return Verdict{}, &Mismatch{Reason: fmt.Sprintf("join state at recovery sequence %d is ahead of the token's %d (was the store restored from a backup?)",
				a.State.RecoverySequence, st.Sequence)}
		}
	}
	if a.Refresh && st.Sequence > 0 {
		return Verdict{}, nil
	}
	v := Verdict{Recovery: true, ExpectedSequence: st.Sequence, Counted: st.Mode == ModeStandard}
	if v.Counted && st.Count >= st.Limit {
		return Verdict{}, fmt.Errorf("%w: %d of %d recoveries used", ErrRecoveryExhausted, st.Count, st.Limit)
	}
	return v, nil
}

// RotationDue reports whether a token's bound key must be rotated at now:
// rotate_after is set and has passed, and the key was not rotated since
// (lastRotated before rotateAfter), so one rotation answers each
// rotate_after an operator sets.
func RotationDue(rotateAfter, lastRotated, now time.Time) bool {
	return !rotateAfter.IsZero() && !now.Before(rotateAfter) && lastRotated.Before(rotateAfter)
}
