package enroll

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/store"
)

// signedAt is what an agent holds after recoveries the store forgot: a
// document this authority signed for the token, at seq of epoch.
func (b *bkEnv) signedAt(t *testing.T, doc string, seq int64, epoch string) string {
	t.Helper()
	js := b.joinState(t, doc)
	js.RecoverySequence, js.Epoch = seq, epoch
	k, err := b.svc.joinStateKeys().current(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out, err := k.Sign(js)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (b *bkEnv) locked(t *testing.T) bool {
	t.Helper()
	_, err := b.st.FindAnyLock(t.Context(), []store.LockTarget{{Kind: store.LockToken, Target: "bot-1"}})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// TestBoundKeypairResync: a join state ahead of the store (what a restore
// from backup leaves) is refused without a lock until an operator opens a
// resync window; inside it, it is accepted once, brings the token forward
// into the window's epoch without taking a recovery, is audited, and its
// lost reply is answered again; a second holder of a pre-restore document
// then locks the token; after the window, the old rules hold.
func TestBoundKeypairResync(t *testing.T) {
	b := newBKEnv(t, 1, boundkeypair.ModeStandard) // the budget is spent by the registration
	var told []string
	b.svc.cfg.BoundKeypair.Ahead = func(token, node string) { told = append(told, token+"/"+node) }
	first, _ := b.register(t)
	ahead := b.signedAt(t, first.JoinState, 4, "")
	copied := b.signedAt(t, first.JoinState, 3, "")

	_, err := b.recover(t, ahead)
	wantRefusal(t, err, KindPermissionDenied, ReasonJoinStateMismatch)
	var ref *Refusal
	if !errors.As(err, &ref) || !strings.Contains(ref.Detail, boundkeypair.ResyncHint) || b.locked(t) {
		t.Fatalf("ahead, no window: %v (locked %v), want a refusal whose audit detail names the window, and no lock", err, b.locked(t))
	}
	if len(told) != 1 || told[0] != "bot-1/node-1" {
		t.Fatalf("the operator's log was told %v, want bot-1/node-1 once", told)
	}

	if _, err := b.st.OpenResync(t.Context(), store.ResyncOpen{ID: "ep-1", For: time.Hour, OpenedBy: "admin:test", Reason: "restore"}, setupEpochLink); err != nil {
		t.Fatal(err)
	}
	_, der := csr(t)
	p := BoundKeypairPayload{Token: "bot-1", NodeID: "node-1", CSR: der, JoinState: ahead}
	res, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, p, answerWith(b.priv))
	if err != nil {
		t.Fatalf("ahead, window open: %v", err)
	}
	js := b.joinState(t, res.JoinState)
	st := b.status(t)
	if js.RecoverySequence != 5 || js.Epoch != "ep-1" || st.RecoverySequence != 5 || st.Epoch != "ep-1" ||
		st.RecoveryCount != 1 || st.BoundInstanceID != res.InstanceID || res.Remaining != 0 {
		t.Fatalf("after the resync: document %+v, token %+v, remaining %d", js, st, res.Remaining)
	}
	var audited bool
	for _, e := range b.audit.events {
		audited = audited || e.Action == "token.resync" && strings.Contains(e.Reason, `sequence 1 (epoch "") brought forward to 5`)
	}
	if !audited {
		t.Fatalf("no token.resync record in %+v", b.audit.events)
	}

	// The reply was lost: the same request again gets the same answer.
	again, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, p, answerWith(b.priv))
	if err != nil || !again.Retry || again.InstanceID != res.InstanceID {
		t.Fatalf("the resync's retry: %+v, %v", again, err)
	}
	if js := b.joinState(t, again.JoinState); js.RecoverySequence != 5 || js.Epoch != "ep-1" {
		t.Fatalf("the retry's document: %+v", js)
	}

	// The agent goes on from its new document.
	_, err = b.recover(t, res.JoinState)
	wantRefusal(t, err, KindFailedPrecondition, ReasonRecoveryExhausted) // a plain recovery counts again

	// Another holder of a pre-restore document: once per token.
	_, err = b.recover(t, copied)
	wantRefusal(t, err, KindPermissionDenied, ReasonJoinStateMismatch)
	if !b.locked(t) {
		t.Fatal("a second pre-restore document inside the window did not lock the token")
	}
	if len(told) != 1 {
		t.Fatalf("refusals other than ahead-outside-a-window were told as such: %v", told)
	}
}

// TestBoundKeypairResyncWindowBounds: a closed window and a stale document
// inside an open one behave as without windows.
func TestBoundKeypairResyncWindowBounds(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	second, err := b.recover(t, first.JoinState)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.OpenResync(t.Context(), store.ResyncOpen{ID: "ep-1", For: time.Hour, OpenedBy: "admin:test"}, setupEpochLink); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.CloseResync(t.Context(), "admin:test", setupEpochLink); err != nil {
		t.Fatal(err)
	}
	_, err = b.recover(t, b.signedAt(t, second.JoinState, 7, ""))
	wantRefusal(t, err, KindPermissionDenied, ReasonJoinStateMismatch)
	if b.locked(t) || b.status(t).RecoverySequence != 2 {
		t.Fatalf("ahead after the window closed: locked %v, token %+v", b.locked(t), b.status(t))
	}

	if _, err := b.st.OpenResync(t.Context(), store.ResyncOpen{ID: "ep-2", For: time.Hour, OpenedBy: "admin:test"}, setupEpochLink); err != nil {
		t.Fatal(err)
	}
	_, err = b.recover(t, first.JoinState) // stale: a real copy
	wantRefusal(t, err, KindPermissionDenied, ReasonJoinStateMismatch)
	if !b.locked(t) {
		t.Fatal("a stale document inside a window did not lock the token")
	}
}

// TestBoundKeypairStaleRaceLocksOnce: many presentations of one stale join
// state at once are all refused, and make exactly one lock row and one
// lock.create record (before, each racer that passed the lock check
// wrote its own lock, and unlocking needed every row deleted).
func TestBoundKeypairStaleRaceLocksOnce(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	if _, err := b.recover(t, first.JoinState); err != nil {
		t.Fatal(err)
	}
	const racers = 32
	errs := make(chan error, racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range racers {
		_, der := csr(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
				CSR: der, JoinState: first.JoinState}, answerWith(b.priv))
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		var r *Refusal
		if !errors.As(err, &r) || r.Kind != KindPermissionDenied || (r.Reason != ReasonJoinStateMismatch && r.Reason != ReasonLocked) {
			t.Errorf("a racing stale presentation: %v, want join_state_mismatch or locked", err)
		}
	}
	locks, err := b.st.ListLocks(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 1 || locks[0].Kind != store.LockToken || locks[0].Target != "bot-1" {
		t.Fatalf("locks after %d racing stale presentations: %+v, want one on token bot-1", racers, locks)
	}
	created := 0
	b.audit.mu.Lock()
	for _, e := range b.audit.events {
		if e.Action == "lock.create" {
			created++
		}
	}
	b.audit.mu.Unlock()
	if created != 1 {
		t.Fatalf("lock.create records: %d, want 1", created)
	}
}
