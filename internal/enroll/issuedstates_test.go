package enroll

import (
	"fmt"
	"testing"

	"github.com/muster-dev/muster/internal/boundkeypair"
)

// TestIssuedStatesMatchVerification: what the memo returns for a document
// this process signed is what verifying it returns, so a join judged on
// either path is judged alike; a document for another node is not taken
// from the memo.
func TestIssuedStatesMatchVerification(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	memo, ok := b.svc.issued.lookup(first.JoinState)
	if !ok {
		t.Fatal("the document just signed is not remembered")
	}
	if verified := b.joinState(t, first.JoinState); memo != verified {
		t.Fatalf("memo %+v, verified %+v", memo, verified)
	}
	if _, ok := b.svc.issued.lookup(first.JoinState + "x"); ok {
		t.Fatal("another document was found")
	}
	// A recovery from the remembered document works as from a verified one.
	if _, err := b.recover(t, first.JoinState); err != nil {
		t.Fatal(err)
	}
}

func TestIssuedStatesBounded(t *testing.T) {
	var m issuedStates
	for i := range maxIssuedStates + 10 {
		m.add(fmt.Sprint(i), boundkeypair.JoinState{RecoverySequence: int64(i)})
	}
	if len(m.byKey) != maxIssuedStates || len(m.order) != maxIssuedStates {
		t.Fatalf("%d entries, %d in order, want %d", len(m.byKey), len(m.order), maxIssuedStates)
	}
	if _, ok := m.lookup("0"); ok {
		t.Fatal("the oldest entry was not evicted")
	}
	if js, ok := m.lookup(fmt.Sprint(maxIssuedStates + 9)); !ok || js.RecoverySequence != maxIssuedStates+9 {
		t.Fatalf("the newest entry: %+v %v", js, ok)
	}
}
