package boundkeypair

import (
	"errors"
	"fmt"
	"time"
)

// Binding is what the authority knows of a token's key when it decides
// whether a resync may also rebind it.
type Binding struct {
	// Key is the fingerprint of the bound key, "" if none is bound (the
	// store was backed up before the agent registered).
	Key string
	// LastRotatedAt is the token's last rotation (zero if none) and
	// CreatedAt its creation.
	LastRotatedAt time.Time
	CreatedAt     time.Time
}

// ErrNoRebind: the join does not qualify to have its resync rebind the
// token; the caller challenges the token's bound key as without a window.
var ErrNoRebind = errors.New("boundkeypair: no rebind")

// MayRebind decides, before the challenge, whether a join whose verified
// join state d names a key other than the token's (an agent that rotated,
// or registered, after the backup the store was restored from) has that
// key challenged instead: nil means the challenge goes to offered, and a
// solved one lets the resync rebind the token to it (Attempt.Rebind).
//
// The key bound to a token changes only by a rotation, which records
// LastRotatedAt, or by the registration of the first key, before which no
// document of the token exists. So a document naming another key than the
// token's and signed after both its last rotation and its creation was
// signed after the backup: it cannot name a key the token rotated away
// from (which may be why it was rotated), nor be a document of a deleted
// token of the same name. Outside a window nothing is rebound.
//
// The rotation time is the store's clock and a document's iat the signing
// replica's, so "after the last rotation" must hold by the clock-skew
// allowance (Leeway): a document signed just before a rotation by a
// replica whose clock runs ahead must not pass for one signed after it (it
// names the key rotated away from, perhaps because it leaked). A genuine
// rebind's document is signed long after the restored token's last
// rotation. The creation check has no allowance, so an agent that
// registered seconds after a backup is still rebound; a namesake's
// document passes it only if the token was deleted and re-created within
// the skew of a document's signing, and a leaked key is refused anyway once
// locked (the guide's answer to a leak), as every offered key is checked
// against the locks.
func MayRebind(b Binding, d *JoinState, offered string, ep Epochs) error {
	switch {
	case !ep.WindowOpen:
		return fmt.Errorf("%w: no resync window is open", ErrNoRebind)
	case d == nil:
		return fmt.Errorf("%w: no join state presented", ErrNoRebind)
	case offered == "" || d.BoundKey != offered:
		return fmt.Errorf("%w: the join state does not name the offered key", ErrNoRebind)
	case offered == b.Key:
		return fmt.Errorf("%w: the join state names the key already bound", ErrNoRebind)
	case !d.IssuedAt.After(b.LastRotatedAt.Add(Leeway)):
		return fmt.Errorf("%w: the join state (issued %s) is not after the token's last rotation (%s) by the clock-skew allowance", ErrNoRebind,
			d.IssuedAt.UTC().Format(time.RFC3339), b.LastRotatedAt.UTC().Format(time.RFC3339))
	case !d.IssuedAt.After(b.CreatedAt):
		return fmt.Errorf("%w: the join state (issued %s) is not after the token's creation (%s)", ErrNoRebind,
			d.IssuedAt.UTC().Format(time.RFC3339), b.CreatedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// judgeRebind judges a join whose challenge was solved with the key its
// join state names, not the token's (MayRebind): it may only be a resync.
// Unlike a plain resync, a document at the token's own sequence and epoch
// is ahead too: it names a key the restored token never had since its last
// rotation, so it was signed after the backup (by a rotation in a refresh,
// which keeps the sequence). Behind still locks; the first join of a token
// restored from before its registration (sequence 0) is judged like any
// other. The mode does not matter: without the document nothing is
// rebound, insecure mode included.
func judgeRebind(st Status, a Attempt, ep Epochs) (Verdict, error) {
	d := a.State
	if d == nil {
		return Verdict{}, &Mismatch{Reason: "a rebind without a join state"}
	}
	if err := ofToken(st, d); err != nil {
		return Verdict{}, err
	}
	var err error
	switch {
	case d.Epoch != st.Epoch:
		err = judgeEpoch(st, d, ep, true)
	case d.RecoverySequence < st.Sequence:
		err = &Mismatch{Lock: true, Reason: fmt.Sprintf("join state naming key %s at recovery sequence %d, the token is at %d",
			d.BoundKey, d.RecoverySequence, st.Sequence)}
	default:
		err = judgeAhead(st, d, ep, true)
	}
	if err != nil {
		return Verdict{}, err
	}
	return Verdict{Recovery: true, Resync: true, Rebind: true, ExpectedSequence: st.Sequence, ExpectedEpoch: st.Epoch,
		Sequence: d.RecoverySequence + 1, Epoch: ep.Current}, nil
}
