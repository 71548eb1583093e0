package boundkeypair

import (
	"errors"
	"strings"
	"testing"
)

var (
	noWindow = Epochs{}
	open1    = Epochs{Current: "e1", WindowOpen: true, Ordinal: map[string]int64{"e1": 1}}
	closed1  = Epochs{Current: "e1", Ordinal: map[string]int64{"e1": 1}}
	open2    = Epochs{Current: "e2", WindowOpen: true, Ordinal: map[string]int64{"e1": 1, "e2": 2}}
)

// TestJudgeEpochs is the table of join states against a restored store:
// token (epoch, sequence) × document (epoch, sequence) × resync window.
func TestJudgeEpochs(t *testing.T) {
	doc := func(epoch string, seq int64) *JoinState { return &JoinState{Epoch: epoch, RecoverySequence: seq} }
	type want struct {
		err    error // nil, ErrJoinStateInvalid
		lock   bool
		resync bool
		seq    int64  // the sequence the verdict records
		epoch  string // the epoch it records
		hint   bool   // the refusal tells the operator to open a window
	}
	cases := []struct {
		name       string
		tokenEpoch string
		tokenSeq   int64
		refresh    bool
		d          *JoinState
		ep         Epochs
		want       want
	}{
		{"ahead, no window: refused, no lock", "", 2, false, doc("", 5), noWindow, want{err: ErrJoinStateInvalid, hint: true}},
		{"ahead, window open: resynced to its sequence + 1 in the window's epoch", "", 2, false, doc("", 5), open1, want{resync: true, seq: 6, epoch: "e1"}},
		{"ahead on a refresh, window open: resynced", "", 2, true, doc("", 5), open1, want{resync: true, seq: 6, epoch: "e1"}},
		{"ahead, window closed", "", 2, false, doc("", 5), closed1, want{err: ErrJoinStateInvalid, hint: true}},
		{"stale, window open: still locks", "", 4, false, doc("", 3), open1, want{err: ErrJoinStateInvalid, lock: true}},
		{"an earlier epoch after the token was resynced: locks", "e1", 6, false, doc("", 5), open1, want{err: ErrJoinStateInvalid, lock: true}},
		{"an earlier epoch, even ahead, after the resync: locks", "e1", 6, false, doc("", 9), open1, want{err: ErrJoinStateInvalid, lock: true}},
		{"an earlier epoch after the window closed: locks", "e1", 6, false, doc("", 9), closed1, want{err: ErrJoinStateInvalid, lock: true}},
		{"an unknown epoch after the token entered the current one: locks", "e1", 6, false, doc("e-lost", 9), open1, want{err: ErrJoinStateInvalid, lock: true}},
		{"an unknown epoch (signed after the backup), window open: resynced", "", 2, false, doc("e-lost", 5), open1, want{resync: true, seq: 6, epoch: "e1"}},
		{"an unknown epoch, no window: refused, no lock", "", 2, false, doc("e-lost", 5), noWindow, want{err: ErrJoinStateInvalid, hint: true}},
		{"an unknown epoch not ahead: refused, no lock", "", 2, false, doc("e-lost", 2), open1, want{err: ErrJoinStateInvalid}},
		{"a known later epoch than the token's: refused, no lock", "", 2, false, doc("e1", 3), open1, want{err: ErrJoinStateInvalid}},
		{"ahead inside the current epoch (restored again): refused, no lock", "e1", 6, false, doc("e1", 9), open1, want{err: ErrJoinStateInvalid}},
		{"ahead of an earlier window's epoch, new window: resynced", "e1", 6, false, doc("e1", 9), open2, want{resync: true, seq: 10, epoch: "e2"}},
		{"the token's own state, refresh: nothing written", "e1", 6, true, doc("e1", 6), open2, want{}},
		{"the token's own state, recovery: the current epoch recorded", "", 2, false, doc("", 2), open1, want{seq: 3, epoch: "e1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := Status{Mode: ModeStandard, Limit: 1, Count: 1, Sequence: tc.tokenSeq, Epoch: tc.tokenEpoch}
			if !tc.want.resync && tc.want.err == nil && !tc.refresh {
				st.Limit = 9 // a plain recovery needs budget; a resync does not
			}
			v, err := Judge(st, Attempt{Refresh: tc.refresh, State: tc.d}, tc.ep)
			if tc.want.err != nil {
				if !errors.Is(err, tc.want.err) {
					t.Fatalf("Judge = %+v, %v, want %v", v, err, tc.want.err)
				}
				if got := errors.Is(err, ErrJoinStateStale); got != tc.want.lock {
					t.Fatalf("lock = %v, want %v (%v)", got, tc.want.lock, err)
				}
				if got := strings.Contains(err.Error(), ResyncHint); got != tc.want.hint {
					t.Fatalf("hint = %v, want %v (%v)", got, tc.want.hint, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Judge = %v, want a verdict", err)
			}
			if v.Resync != tc.want.resync || v.Recovery != (tc.want.seq != 0) || v.Sequence != tc.want.seq && v.Recovery ||
				v.Epoch != tc.want.epoch && v.Recovery {
				t.Fatalf("verdict %+v, want %+v", v, tc.want)
			}
			if v.Resync && (v.Counted || v.ExpectedSequence != tc.tokenSeq || v.ExpectedEpoch != tc.tokenEpoch) {
				t.Fatalf("a resync %+v: counted, or not from the token's (%q, %d)", v, tc.tokenEpoch, tc.tokenSeq)
			}
		})
	}
}

// TestResyncCannotLaunderACopy plays a restore under a copied key: the
// genuine agent recovered after the backup (its document is ahead), the
// copy holds an older document that was stale before the restore. Inside
// the window, whichever comes first is brought forward, and the other is
// refused with a lock, as it would have been without the restore.
func TestResyncCannotLaunderACopy(t *testing.T) {
	genuine, stolen := &JoinState{RecoverySequence: 3}, &JoinState{RecoverySequence: 2}
	for _, order := range [][2]*JoinState{{genuine, stolen}, {stolen, genuine}} {
		st := Status{Mode: ModeStandard, Limit: 9, Count: 1, Sequence: 1} // as restored
		v, err := Judge(st, Attempt{State: order[0]}, open1)
		if err != nil || !v.Resync {
			t.Fatalf("the first holder (sequence %d): %+v, %v; want a resync", order[0].RecoverySequence, v, err)
		}
		st.Sequence, st.Epoch = v.Sequence, v.Epoch // as the write leaves it
		_, err = Judge(st, Attempt{State: order[1]}, open1)
		if !errors.Is(err, ErrJoinStateStale) {
			t.Fatalf("the second holder (sequence %d) after the first was resynced: %v, want a lock", order[1].RecoverySequence, err)
		}
	}
}
