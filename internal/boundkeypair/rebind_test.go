package boundkeypair

import (
	"errors"
	"testing"
	"time"
)

// TestMayRebind is the table of what lets a join have the key its join
// state names challenged instead of the token's: each anti-laundering
// condition refuses on its own.
func TestMayRebind(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rotated := created.Add(24 * time.Hour)
	after := rotated.Add(time.Hour)
	doc := func(key string, iat time.Time) *JoinState {
		return &JoinState{BoundKey: key, IssuedAt: iat, RecoverySequence: 3}
	}
	rotatedB := Binding{Key: "SHA256:A", LastRotatedAt: rotated, CreatedAt: created}
	unbound := Binding{CreatedAt: created}
	cases := []struct {
		name    string
		b       Binding
		d       *JoinState
		offered string
		ep      Epochs
		ok      bool
	}{
		{"rotated after the backup, window open", rotatedB, doc("SHA256:B", after), "SHA256:B", open1, true},
		{"registered after the backup, window open", unbound, doc("SHA256:B", after), "SHA256:B", open1, true},
		{"no window: nothing changes", rotatedB, doc("SHA256:B", after), "SHA256:B", noWindow, false},
		{"window closed", rotatedB, doc("SHA256:B", after), "SHA256:B", closed1, false},
		{"no join state", rotatedB, nil, "SHA256:B", open1, false},
		{"no key offered", rotatedB, doc("SHA256:B", after), "", open1, false},
		{"the document names another key than the offered one", rotatedB, doc("SHA256:C", after), "SHA256:B", open1, false},
		{"the document names the key already bound", rotatedB, doc("SHA256:A", after), "SHA256:A", open1, false},
		{"a document from before the last rotation (a retired key)", rotatedB, doc("SHA256:B", rotated.Add(-time.Second)), "SHA256:B", open1, false},
		{"a document issued at the last rotation", rotatedB, doc("SHA256:B", rotated), "SHA256:B", open1, false},
		{"a document within the clock-skew allowance after the last rotation", rotatedB, doc("SHA256:B", rotated.Add(Leeway)), "SHA256:B", open1, false},
		{"a document just past the allowance after the last rotation", rotatedB, doc("SHA256:B", rotated.Add(Leeway+time.Second)), "SHA256:B", open1, true},
		{"a document from before the token was created (a deleted namesake)", unbound, doc("SHA256:B", created.Add(-time.Hour)), "SHA256:B", open1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := MayRebind(tc.b, tc.d, tc.offered, tc.ep)
			if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrNoRebind) {
				t.Fatalf("MayRebind = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestJudgeRebind is the table of a join whose challenge was solved with
// the key its join state names: it is a resync or nothing.
func TestJudgeRebind(t *testing.T) {
	doc := func(epoch string, seq int64) *JoinState {
		return &JoinState{Epoch: epoch, RecoverySequence: seq, BoundKey: "SHA256:B"}
	}
	type want struct {
		err  error
		lock bool
		seq  int64
	}
	cases := []struct {
		name       string
		mode       string
		tokenEpoch string
		tokenSeq   int64
		refresh    bool
		d          *JoinState
		ep         Epochs
		want       want
	}{
		{"ahead: resynced and rebound", ModeStandard, "", 2, false, doc("", 5), open1, want{seq: 6}},
		{"at the token's sequence (rotated in a refresh after the backup): resynced and rebound", ModeStandard, "", 2, false, doc("", 2), open1, want{seq: 3}},
		{"on a refresh certificate: still a resync", ModeStandard, "", 2, true, doc("", 2), open1, want{seq: 3}},
		{"a token restored from before its registration (sequence 0)", ModeStandard, "", 0, false, doc("", 1), open1, want{seq: 2}},
		{"an unknown epoch: resynced and rebound", ModeStandard, "", 2, false, doc("e-lost", 2), open1, want{seq: 3}},
		{"insecure mode: rebound only through the document too", ModeInsecure, "", 2, false, doc("", 4), open1, want{seq: 5}},
		{"behind: locks", ModeStandard, "", 4, false, doc("", 3), open1, want{err: ErrJoinStateInvalid, lock: true}},
		{"no window (closed since the challenge): refused, no lock", ModeStandard, "", 2, false, doc("", 5), closed1, want{err: ErrJoinStateInvalid}},
		{"once resynced, a pre-restore document: locks", ModeStandard, "e1", 6, false, doc("", 5), open1, want{err: ErrJoinStateInvalid, lock: true}},
		{"once resynced, a document of an unknown epoch: locks", ModeStandard, "e1", 6, false, doc("e-lost", 9), open1, want{err: ErrJoinStateInvalid, lock: true}},
		{"inside the current epoch (restored again): refused, no lock", ModeStandard, "e1", 6, false, doc("e1", 6), open1, want{err: ErrJoinStateInvalid}},
		{"no document", ModeStandard, "", 2, false, nil, open1, want{err: ErrJoinStateInvalid}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The budget is spent: a rebind takes nothing of it.
			st := Status{Mode: tc.mode, Limit: 1, Count: 1, Sequence: tc.tokenSeq, Epoch: tc.tokenEpoch}
			v, err := Judge(st, Attempt{Refresh: tc.refresh, State: tc.d, Rebind: true}, tc.ep)
			if tc.want.err != nil {
				if !errors.Is(err, tc.want.err) || errors.Is(err, ErrJoinStateStale) != tc.want.lock {
					t.Fatalf("Judge = %+v, %v, want %v (lock %v)", v, err, tc.want.err, tc.want.lock)
				}
				return
			}
			if err != nil || !v.Resync || !v.Rebind || !v.Recovery || v.Counted || v.Sequence != tc.want.seq || v.Epoch != tc.ep.Current ||
				v.ExpectedSequence != tc.tokenSeq || v.ExpectedEpoch != tc.tokenEpoch {
				t.Fatalf("Judge = %+v, %v, want a rebinding resync to %d", v, err, tc.want.seq)
			}
		})
	}
}

// TestRebindCannotLaunderACopy: after a rotation the backup did not see,
// the agent's document (naming its new key) is resynced and rebinds the
// token; the copy's pre-restore document (naming the old key, the one the
// restored token has) then locks, as without the restore. And the other
// way round: a copy presenting the old key first is resynced without a
// rebind, and the rotated agent's document then locks.
func TestRebindCannotLaunderACopy(t *testing.T) {
	rotated := &JoinState{RecoverySequence: 2, BoundKey: "SHA256:B"}
	copied := &JoinState{RecoverySequence: 2, BoundKey: "SHA256:A"}
	st := Status{Mode: ModeStandard, Limit: 9, Count: 1, Sequence: 2} // as restored, key A
	v, err := Judge(st, Attempt{State: rotated, Rebind: true}, open1)
	if err != nil || !v.Rebind {
		t.Fatalf("the rotated agent: %+v, %v; want a rebinding resync", v, err)
	}
	after := st
	after.Sequence, after.Epoch = v.Sequence, v.Epoch
	if _, err := Judge(after, Attempt{State: copied}, open1); !errors.Is(err, ErrJoinStateStale) {
		t.Fatalf("the copy's document after the rebind: %v, want a lock", err)
	}
	// The copy's document is at the token's own state: a plain recovery
	// (counted) moves the token into the window's epoch, and the rotated
	// agent's document, of the epoch before, then locks.
	v, err = Judge(st, Attempt{State: copied}, open1)
	if err != nil || v.Resync {
		t.Fatalf("the copy first: %+v, %v; want a plain recovery", v, err)
	}
	after.Sequence, after.Epoch = v.Sequence, v.Epoch
	if _, err := Judge(after, Attempt{State: rotated, Rebind: true}, open1); !errors.Is(err, ErrJoinStateStale) {
		t.Fatalf("the rotated agent's document after the copy recovered: %v, want a lock", err)
	}
}
