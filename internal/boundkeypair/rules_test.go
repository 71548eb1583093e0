package boundkeypair

import (
	"errors"
	"testing"
	"time"
)

// TestJudge is the table of recovery cases: modes × budget × join states
// × refresh or recovery.
func TestJudge(t *testing.T) {
	at := func(seq int64) *JoinState { return &JoinState{RecoverySequence: seq} }
	forged := &invalidState{"signature does not verify"}
	type want struct {
		err      error // nil, ErrRecoveryExhausted, ErrJoinStateInvalid
		lock     bool
		recovery bool
		counted  bool
	}
	refresh, recovers, counts := want{}, want{recovery: true}, want{recovery: true, counted: true}
	exhausted := want{err: ErrRecoveryExhausted}
	mismatch, stale := want{err: ErrJoinStateInvalid}, want{err: ErrJoinStateInvalid, lock: true}

	cases := []struct {
		name    string
		mode    string
		limit   int64
		count   int64
		seq     int64
		refresh bool
		state   *JoinState
		bad     error
		want    want
	}{
		// The first join needs no join state and counts under standard.
		{"first join, standard", ModeStandard, 1, 0, 0, false, nil, nil, counts},
		{"first join, standard, limit 0", ModeStandard, 0, 0, 0, false, nil, nil, exhausted},
		{"first join, relaxed, limit 0", ModeRelaxed, 0, 0, 0, false, nil, nil, recovers},
		{"first join, insecure", ModeInsecure, 0, 0, 0, false, nil, nil, recovers},
		// Refreshes consume nothing, in every mode, even with no budget.
		{"refresh, standard, exhausted", ModeStandard, 1, 1, 1, true, at(1), nil, refresh},
		{"refresh, relaxed", ModeRelaxed, 1, 1, 4, true, at(4), nil, refresh},
		{"refresh, insecure, no state", ModeInsecure, 1, 1, 4, true, nil, nil, refresh},
		// Recoveries.
		{"recovery, standard, budget left", ModeStandard, 3, 1, 1, false, at(1), nil, counts},
		{"recovery, standard, exhausted", ModeStandard, 1, 1, 1, false, at(1), nil, exhausted},
		{"recovery, standard, limit lowered below count", ModeStandard, 1, 2, 2, false, at(2), nil, exhausted},
		{"recovery, relaxed, past the limit", ModeRelaxed, 1, 1, 5, false, at(5), nil, recovers},
		{"recovery, insecure, no state", ModeInsecure, 1, 1, 5, false, nil, nil, recovers},
		{"recovery, insecure, stale state ignored", ModeInsecure, 1, 1, 5, false, at(2), nil, recovers},
		// Join states.
		{"stale, standard", ModeStandard, 9, 2, 2, false, at(1), nil, stale},
		{"stale, relaxed", ModeRelaxed, 9, 0, 7, false, at(6), nil, stale},
		{"stale on a refresh", ModeStandard, 9, 2, 2, true, at(1), nil, stale},
		{"missing, standard", ModeStandard, 9, 1, 1, false, nil, nil, mismatch},
		{"missing, relaxed", ModeRelaxed, 9, 1, 1, false, nil, nil, mismatch},
		{"forged, standard", ModeStandard, 9, 1, 1, false, nil, forged, mismatch},
		{"ahead (restored store), standard", ModeStandard, 9, 1, 1, false, at(2), nil, mismatch},
		{"ahead (restored store), relaxed", ModeRelaxed, 9, 1, 1, true, at(3), nil, mismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Judge(Status{Mode: tc.mode, Limit: tc.limit, Count: tc.count, Sequence: tc.seq},
				Attempt{Refresh: tc.refresh, State: tc.state, StateErr: tc.bad}, Epochs{})
			switch {
			case tc.want.err == nil && err != nil:
				t.Fatalf("Judge = %v, want a verdict", err)
			case tc.want.err != nil && !errors.Is(err, tc.want.err):
				t.Fatalf("Judge = %v, %v, want %v", v, err, tc.want.err)
			case tc.want.err != nil:
				if got := errors.Is(err, ErrJoinStateStale); got != tc.want.lock {
					t.Fatalf("lock = %v, want %v (%v)", got, tc.want.lock, err)
				}
				return
			}
			if v.Recovery != tc.want.recovery || v.Counted != tc.want.counted {
				t.Fatalf("verdict %+v, want recovery %v counted %v", v, tc.want.recovery, tc.want.counted)
			}
			if v.Recovery && v.ExpectedSequence != tc.seq {
				t.Fatalf("expected sequence %d, want the token's %d", v.ExpectedSequence, tc.seq)
			}
		})
	}
}

func TestJudgeRefusesUnknownMode(t *testing.T) {
	if _, err := Judge(Status{Mode: "lenient"}, Attempt{}, Epochs{}); err == nil {
		t.Fatal("an unknown mode was judged")
	}
}

func TestRemaining(t *testing.T) {
	for _, tc := range []struct{ limit, count, want int64 }{{3, 1, 2}, {1, 1, 0}, {1, 3, 0}} {
		if got := (Status{Limit: tc.limit, Count: tc.count}).Remaining(); got != tc.want {
			t.Errorf("Remaining(%d, %d) = %d, want %d", tc.limit, tc.count, got, tc.want)
		}
	}
}

func TestSpecCheck(t *testing.T) {
	ok := Spec{Name: "bot-1", Node: "bot-1", RecoveryLimit: 1, RecoveryMode: ModeStandard}
	for name, mutate := range map[string]func(*Spec){
		"bad name":               func(s *Spec) { s.Name = "Bot_1" },
		"a join token":           func(s *Spec) { s.Name = "abcdef.0123456789abcdef" },
		"a join token cut short": func(s *Spec) { s.Name = "abcdef.0123" },
		"bad node":               func(s *Spec) { s.Node = "" },
		"unknown mode":           func(s *Spec) { s.RecoveryMode = "lenient" },
		"negative":               func(s *Spec) { s.RecoveryLimit = -1 },
		"huge":                   func(s *Spec) { s.RecoveryLimit = MaxRecoveryLimit + 1 },
		"malformed key":          func(s *Spec) { s.InitialPublicKey = "ssh-rsa AAAA" },
	} {
		s := ok
		mutate(&s)
		if _, err := s.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	// A name whose first label has a token ID's form, and which cannot
	// hold a token's secret, is a name like any other.
	for _, name := range []string{"web001.prod.example", "db0001.eu-west-1"} {
		s := ok
		s.Name, s.Node = name, name
		if _, err := s.Check(); err != nil {
			t.Errorf("bot %q: %v", name, err)
		}
	}
	withKey := ok
	withKey.InitialPublicKey = sshKey + " comment"
	if k, err := withKey.Check(); err != nil || k.String() != sshKey {
		t.Fatalf("Check with a key: %v, %q", err, k.String())
	}
	if (Spec{RecoveryMode: ModeInsecure}).Warning() == "" || ok.Warning() != "" {
		t.Error("only insecure mode warns")
	}
}

// TestRotationDue: a rotation is due once per rotate_after that has passed.
func TestRotationDue(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	cases := map[string]struct {
		after, last time.Time
		want        bool
	}{
		"no rotate_after":             {time.Time{}, time.Time{}, false},
		"rotate_after in the future":  {t0.Add(time.Hour), time.Time{}, false},
		"passed, never rotated":       {t0.Add(-time.Hour), time.Time{}, true},
		"passed, rotated before it":   {t0.Add(-time.Hour), t0.Add(-2 * time.Hour), true},
		"passed, rotated since":       {t0.Add(-time.Hour), t0.Add(-time.Minute), false},
		"exactly now, never rotated":  {t0, time.Time{}, true},
		"rotated exactly at the mark": {t0.Add(-time.Hour), t0.Add(-time.Hour), false},
	}
	for name, c := range cases {
		if got := RotationDue(c.after, c.last, t0); got != c.want {
			t.Errorf("%s: RotationDue = %v, want %v", name, got, c.want)
		}
	}
}

// TestJudgeRefusesANamesakesJoinState: a document of a deleted token of
// the same name (what a copy of its key holds after the clone way out) is
// refused whatever its sequence, epoch or window, without a lock (the new
// token's holder is not the one refused), in a plain join and a rebind;
// documents of the token itself pass. A document signed before
// token_created was added is judged by its iat.
func TestJudgeRefusesANamesakesJoinState(t *testing.T) {
	created := time.Date(2026, 11, 27, 12, 0, 0, 500_000_000, time.UTC)
	earlier := created.Add(-time.Hour)
	open := Epochs{Current: "ep-1", WindowOpen: true, Ordinal: map[string]int64{"ep-1": 1}}
	closed := Epochs{Ordinal: map[string]int64{}}
	cases := []struct {
		name   string
		state  JoinState
		ep     Epochs
		rebind bool
		ok     bool
	}{
		{"namesake ahead, window open", JoinState{RecoverySequence: 2, TokenCreated: earlier, IssuedAt: created.Add(time.Minute)}, open, false, false},
		{"namesake at the token's sequence, no window", JoinState{RecoverySequence: 1, TokenCreated: earlier, IssuedAt: created.Add(time.Minute)}, closed, false, false},
		{"namesake of an unknown epoch, window open", JoinState{RecoverySequence: 1, Epoch: "ep-0", TokenCreated: earlier}, open, false, false},
		{"namesake rebind, window open", JoinState{RecoverySequence: 2, TokenCreated: earlier, IssuedAt: created.Add(time.Minute)}, open, true, false},
		{"namesake a microsecond apart", JoinState{RecoverySequence: 1, TokenCreated: created.Add(time.Microsecond)}, closed, false, false},
		{"legacy namesake ahead, window open", JoinState{RecoverySequence: 2, IssuedAt: created.Add(-time.Second).Truncate(time.Second)}, open, false, false},
		{"legacy namesake at the token's sequence", JoinState{RecoverySequence: 1, IssuedAt: earlier}, closed, false, false},
		{"the token's own", JoinState{RecoverySequence: 1, TokenCreated: created}, closed, false, true},
		{"the token's own, ahead, window open", JoinState{RecoverySequence: 2, TokenCreated: created}, open, false, true},
		{"the token's own legacy, signed in its creation's second", JoinState{RecoverySequence: 1, IssuedAt: created.Truncate(time.Second)}, closed, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := Status{Mode: ModeRelaxed, Limit: 9, Sequence: 1, Created: created}
			d := c.state
			_, err := Judge(st, Attempt{State: &d, Rebind: c.rebind}, c.ep)
			if c.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrJoinStateInvalid) || errors.Is(err, ErrJoinStateStale) {
				t.Fatalf("err = %v, want a join_state_mismatch that locks nothing", err)
			}
		})
	}
}
