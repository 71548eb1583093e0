package enroll

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// lockingStore creates a lock on target just before the join's or
// renewal's write, after the request's read found none: an operator's
// `lock create` racing the request.
type lockingStore struct {
	Store
	st     store.Store
	target func() store.LockTarget
}

func (l lockingStore) lock(ctx context.Context) {
	if l.target == nil {
		return
	}
	t := l.target()
	if err := l.st.InsertLock(ctx, store.Lock{ID: "l-race", Kind: t.Kind, Target: t.Target, CreatedBy: "admin",
		CreatedAt: time.Now()}, setupLink); err != nil {
		panic(err)
	}
}

func (l lockingStore) CommitJoin(ctx context.Context, j store.Join) (store.JoinResult, error) {
	l.lock(ctx)
	return l.Store.CommitJoin(ctx, j)
}

func (l lockingStore) CommitRenewal(ctx context.Context, r store.Renewal) (store.Instance, error) {
	l.lock(ctx)
	return l.Store.CommitRenewal(ctx, r)
}

// wantLockedAtWrite checks a refusal by the lock created at the write:
// the code and reason word of a lock seen at the read, and the audit
// record naming the lock.
func wantLockedAtWrite(t *testing.T, e *env, err error, target store.LockTarget) {
	t.Helper()
	wantRefusal(t, err, KindPermissionDenied, ReasonLocked)
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	if len(e.audit.refused) == 0 {
		t.Fatal("the refusal was not audited")
	}
	got := e.audit.refused[len(e.audit.refused)-1].Reason
	if want := "locked: lock l-race on " + target.Kind + " " + target.Target + ", at the write; muster lock delete l-race lifts it (muster lock list says why it was made)"; got != want {
		t.Errorf("audit reason %q, want %q", got, want)
	}
}

// TestLockBetweenReadAndWrite: a lock created after a request's read
// found none refuses its write (docs/threat-model.md: a lock stops
// renewals at once), answered and audited as a lock seen at the read, and
// nothing is issued. Before, the write checked only the generation (or
// the token's uses) and the renewal or join went through.
func TestLockBetweenReadAndWrite(t *testing.T) {
	t.Run("token join, lock on the token", func(t *testing.T) {
		var target store.LockTarget
		e := newEnv(t, nil)
		e.svc.cfg.Store = lockingStore{Store: e.st, st: e.st, target: func() store.LockTarget { return target }}
		tok := e.token(t, 1)
		target = store.LockTarget{Kind: store.LockToken, Target: tok.ID}
		_, der := csr(t)
		_, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
		wantLockedAtWrite(t, e, err, target)
		if _, err := e.st.GetNode(t.Context(), "n1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("node written: %v", err)
		}
	})
	t.Run("renewal, lock on the instance", func(t *testing.T) {
		var ls *lockingStore
		e := newEnv(t, func(s Store) Store { ls = &lockingStore{Store: s}; return ls })
		ls.st = e.st
		tok := e.token(t, 1)
		_, der := csr(t)
		joined, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
		if err != nil {
			t.Fatal(err)
		}
		target := store.LockTarget{Kind: store.LockInstance, Target: joined.InstanceID}
		ls.target = func() store.LockTarget { return target }
		chain, _ := ca.ParseCertsPEM(joined.ChainPEM)
		_, der = csr(t)
		_, err = e.svc.Renew(t.Context(), Request{}, chain[0], der)
		wantLockedAtWrite(t, e, err, target)
		if in, err := e.st.GetInstance(t.Context(), joined.InstanceID); err != nil || in.Generation != 0 {
			t.Fatalf("instance after the refused renewal: generation %d, %v", in.Generation, err)
		}
	})
	t.Run("bound-keypair refresh, lock on the bound key", func(t *testing.T) {
		b := newBKEnv(t, 1, boundkeypair.ModeStandard)
		first, _ := b.register(t)
		leaf, err := ca.ParseCertsPEM(first.ChainPEM)
		if err != nil {
			t.Fatal(err)
		}
		target := store.LockTarget{Kind: store.LockPublicKey, Target: b.pub.Fingerprint()}
		b.svc.cfg.Store = lockingStore{Store: b.st, st: b.st, target: func() store.LockTarget { return target }}
		_, der := csr(t)
		_, err = b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
			CSR: der, JoinState: first.JoinState, Cert: leaf[0]}, answerWith(b.priv))
		wantLockedAtWrite(t, b.env, err, target)
		if in, err := b.st.GetInstance(t.Context(), first.InstanceID); err != nil || in.Generation != 0 {
			t.Fatalf("instance after the refused refresh: generation %d, %v", in.Generation, err)
		}
	})
	t.Run("bound-keypair recovery, lock on the node", func(t *testing.T) {
		b := newBKEnv(t, 5, boundkeypair.ModeStandard)
		first, _ := b.register(t)
		target := store.LockTarget{Kind: store.LockNode, Target: "node-1"}
		b.svc.cfg.Store = lockingStore{Store: b.st, st: b.st, target: func() store.LockTarget { return target }}
		before := b.status(t)
		_, err := b.recover(t, first.JoinState)
		wantLockedAtWrite(t, b.env, err, target)
		if after := b.status(t); after.RecoverySequence != before.RecoverySequence {
			t.Fatalf("recovery sequence %d after the refused recovery, want %d", after.RecoverySequence, before.RecoverySequence)
		}
		if n, err := b.st.GetNode(t.Context(), "node-1"); err != nil || n.InstanceID != first.InstanceID || strings.TrimSpace(n.InstanceID) == "" {
			t.Fatalf("node after the refused recovery: %+v, %v", n, err)
		}
	})
}
