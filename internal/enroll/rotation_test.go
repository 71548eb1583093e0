package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// answerInTurn solves the n-th challenge with keys[n]; a nil key (or a
// challenge past the list) is an agent that is gone: the exchange fails.
func answerInTurn(keys ...ed25519.PrivateKey) (Challenge, *int) {
	n := new(int)
	return func(ctx context.Context, b []byte) ([]byte, error) {
		i := *n
		*n++
		if i >= len(keys) || keys[i] == nil {
			return nil, context.Canceled
		}
		return answerWith(keys[i])(ctx, b)
	}, n
}

func newBoundKey(t *testing.T) (ed25519.PrivateKey, boundkeypair.PublicKey) {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	k, err := boundkeypair.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return priv, k
}

// TestBoundKeypairRotation is the table of rotations: asked by the
// authority (rotate_after passed) or by the agent, on a refresh or a
// recovery, and the ways the second challenge can fail. A rotation commits
// only with the second challenge solved by the new key, in the join's (or
// renewal's) write; a failed one leaves the old key bound and working.
func TestBoundKeypairRotation(t *testing.T) {
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name        string
		rotateAfter time.Time
		refresh     bool // a refresh (valid certificate), else a recovery
		offer       bool // the agent sends new_public_key in its init
		ask         bool // the agent answers the authority's request for a key
		second      func(b *bkEnv, newPriv ed25519.PrivateKey) ed25519.PrivateKey
		lockNew     bool
		kind        Kind
		reason      string
		rotated     bool
		asked       bool
	}{
		{name: "due, refresh", rotateAfter: past, refresh: true, ask: true, rotated: true, asked: true},
		{name: "due, recovery", rotateAfter: past, ask: true, rotated: true, asked: true},
		{name: "not due", rotateAfter: future, refresh: true, ask: true},
		{name: "never set", refresh: true, ask: true},
		{name: "agent offers, refresh", refresh: true, offer: true, rotated: true},
		{name: "agent offers, recovery", offer: true, rotated: true},
		{name: "due, agent cannot be asked", rotateAfter: past, refresh: true},
		{name: "second challenge signed by the old key", rotateAfter: past, refresh: true, ask: true, asked: true,
			second: func(b *bkEnv, _ ed25519.PrivateKey) ed25519.PrivateKey { return b.priv }, kind: KindUnauthenticated, reason: ReasonChallengeFailed},
		{name: "agent dies between the challenges", rotateAfter: past, refresh: true, ask: true, asked: true,
			second: func(*bkEnv, ed25519.PrivateKey) ed25519.PrivateKey { return nil }, kind: -1},
		{name: "new key locked", rotateAfter: past, refresh: true, ask: true, asked: true, lockNew: true,
			kind: KindPermissionDenied, reason: ReasonLocked},
		// Offered in init, the new key is in the first lock query: refused
		// before a second challenge is sent.
		{name: "new key offered and locked", refresh: true, offer: true, lockNew: true,
			kind: KindPermissionDenied, reason: ReasonLocked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBKEnv(t, 5, boundkeypair.ModeStandard)
			first, _ := b.register(t)
			if !tc.rotateAfter.IsZero() {
				spec := b.status(t).Spec
				spec.RotateAfter = tc.rotateAfter
				if _, err := b.st.UpdateBoundKeypairSpec(t.Context(), "bot-1", spec, ""); err != nil {
					t.Fatal(err)
				}
			}
			newPriv, newPub := newBoundKey(t)
			if tc.lockNew {
				if err := b.st.InsertLock(t.Context(), store.Lock{ID: "lock-new", Kind: store.LockPublicKey, Target: newPub.Fingerprint(),
					CreatedBy: "test", CreatedAt: time.Now()}, setupLink); err != nil {
					t.Fatal(err)
				}
			}
			second := newPriv
			if tc.second != nil {
				second = tc.second(b, newPriv)
			}
			ch, _ := answerInTurn(b.priv, second)
			_, der := csr(t)
			p := BoundKeypairPayload{Token: "bot-1", NodeID: "node-1", CSR: der, JoinState: first.JoinState}
			if tc.refresh {
				leaf, err := ca.ParseCertsPEM(first.ChainPEM)
				if err != nil {
					t.Fatal(err)
				}
				p.Cert = leaf[0]
			}
			if tc.offer {
				p.NewPublicKey = newPub.String()
			}
			asked := false
			if tc.ask {
				p.NewKey = func(context.Context) (string, error) { asked = true; return newPub.String(), nil }
			}
			before := b.status(t)
			res, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, p, ch)
			if asked != tc.asked {
				t.Errorf("asked for a new key: %v, want %v", asked, tc.asked)
			}
			switch {
			case tc.kind == -1:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("err = %v, want the exchange's failure", err)
				}
			case tc.kind != 0:
				wantRefusal(t, err, tc.kind, tc.reason)
			case err != nil:
				t.Fatal(err)
			}
			after := b.status(t)
			if !tc.rotated {
				if after.BoundPublicKey != b.pub.String() || !after.LastRotatedAt.IsZero() || after.RecoverySequence != before.RecoverySequence && err != nil {
					t.Fatalf("status after no rotation: %+v", after)
				}
				if err == nil && b.joinState(t, res.JoinState).BoundKey != b.pub.Fingerprint() {
					t.Fatal("join state names another key than the bound one")
				}
				// The old key still works: a recovery with it succeeds.
				if err != nil {
					if _, err := b.recover(t, first.JoinState); err != nil {
						t.Fatalf("the old key after a failed rotation: %v", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if after.BoundPublicKey != newPub.String() || after.LastRotatedAt.IsZero() {
				t.Fatalf("status after the rotation: %+v", after)
			}
			if js := b.joinState(t, res.JoinState); js.BoundKey != newPub.Fingerprint() {
				t.Fatalf("join state bound key %s, want the new key's %s", js.BoundKey, newPub.Fingerprint())
			}
			// The token's binding changed: the audit record of the join or
			// refresh that changed it names the new key, a refresh's too.
			b.audit.mu.Lock()
			last := b.audit.events[len(b.audit.events)-1]
			b.audit.mu.Unlock()
			if want := "rotated to " + newPub.Fingerprint(); last.Result != "ok" || !strings.Contains(last.Reason, want) {
				t.Errorf("audit record %s %s %q, want it to say %q", last.Action, last.Result, last.Reason, want)
			}
			if tc.refresh && (res.InstanceID != first.InstanceID || after.RecoverySequence != before.RecoverySequence) {
				t.Fatalf("a refresh that rotated made instance %s, sequence %d", res.InstanceID, after.RecoverySequence)
			}
			if !tc.refresh && (res.InstanceID == first.InstanceID || after.RecoverySequence != before.RecoverySequence+1) {
				t.Fatalf("a recovery that rotated made instance %s, sequence %d", res.InstanceID, after.RecoverySequence)
			}
			// The old key is no longer bound; the new one is, and a due
			// rotation is not asked again.
			_, der = csr(t)
			_, err = b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
				CSR: der, JoinState: res.JoinState}, answerWith(b.priv))
			wantRefusal(t, err, KindUnauthenticated, ReasonChallengeFailed)
			// A machine restored from before the rotation: its refusal's
			// record says how to compare the keys and come back.
			b.wantAuditedWayOut(t, "muster token get bot-1 shows its fingerprint, muster agent status on the machine the agent's")
			_, der = csr(t)
			again := false
			if _, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
				CSR: der, JoinState: res.JoinState, NewKey: func(context.Context) (string, error) { again = true; return "", errors.New("asked") }},
				answerWith(newPriv)); err != nil {
				t.Fatalf("recovery with the new key: %v", err)
			}
			if again {
				t.Fatal("asked to rotate again after the rotation")
			}
		})
	}
}

// TestBoundKeypairRotationPendingKeyRetried: an agent that died between
// the two challenges still holds its old key and the pending new one; its
// next join proves the old key and offers the pending one, and the
// rotation completes then.
func TestBoundKeypairRotationPendingKeyRetried(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	spec := b.status(t).Spec
	spec.RotateAfter = time.Now().Add(-time.Minute)
	if _, err := b.st.UpdateBoundKeypairSpec(t.Context(), "bot-1", spec, ""); err != nil {
		t.Fatal(err)
	}
	newPriv, newPub := newBoundKey(t)
	dies, _ := answerInTurn(b.priv)
	_, der := csr(t)
	if _, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, JoinState: first.JoinState, NewKey: func(context.Context) (string, error) { return newPub.String(), nil }}, dies); err == nil {
		t.Fatal("a join whose agent died between the challenges succeeded")
	}
	if st := b.status(t); st.BoundPublicKey != b.pub.String() || st.RecoverySequence != 1 {
		t.Fatalf("the interrupted rotation changed the token: %+v", st)
	}
	ch, n := answerInTurn(b.priv, newPriv)
	_, der = csr(t)
	res, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, JoinState: first.JoinState, NewPublicKey: newPub.String()}, ch)
	if err != nil {
		t.Fatalf("the retried rotation: %v", err)
	}
	if *n != 2 || b.status(t).BoundPublicKey != newPub.String() || b.joinState(t, res.JoinState).BoundKey != newPub.Fingerprint() {
		t.Fatalf("after %d challenges the bound key is not the pending one", *n)
	}
}

// TestBoundKeypairLowBudgetWarning: a counted recovery that leaves the
// threshold or fewer is audited (token.recoveries_low) and reported; the
// first join above it, refreshes and a disabled threshold say nothing.
func TestBoundKeypairLowBudgetWarning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		warnAt int64
		want   []int64 // the remaining counts warned about, in order
	}{
		{"default threshold 1", 1, []int64{1, 0}},
		{"threshold 0", 0, []int64{0}},
		{"disabled", -1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBKEnv(t, 3, boundkeypair.ModeStandard)
			var warned []int64
			b.svc.cfg.BoundKeypair.WarnAt = tc.warnAt
			b.svc.cfg.BoundKeypair.Low = func(token, node string, remaining int64) {
				if token != "bot-1" || node != "node-1" {
					t.Errorf("Low(%s, %s)", token, node)
				}
				warned = append(warned, remaining)
			}
			low := func() (n int) {
				for _, e := range b.audit.events {
					if e.Action == "token.recoveries_low" {
						n++
						if e.Target != "token bot-1" || e.Actor != "authority" {
							t.Errorf("audit event %+v", e)
						}
					}
				}
				return n
			}
			res, _ := b.register(t) // 2 left
			leaf, err := ca.ParseCertsPEM(res.ChainPEM)
			if err != nil {
				t.Fatal(err)
			}
			_, der := csr(t)
			if _, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
				CSR: der, JoinState: res.JoinState, Cert: leaf[0]}, answerWith(b.priv)); err != nil {
				t.Fatalf("refresh: %v", err)
			}
			for range 2 { // 1 left, then 0
				if res, err = b.recover(t, res.JoinState); err != nil {
					t.Fatal(err)
				}
			}
			if len(warned) != len(tc.want) || low() != len(tc.want) {
				t.Fatalf("warned %v with %d audit events, want %v", warned, low(), tc.want)
			}
			for i := range warned {
				if warned[i] != tc.want[i] {
					t.Fatalf("warned %v, want %v", warned, tc.want)
				}
			}
		})
	}
}
