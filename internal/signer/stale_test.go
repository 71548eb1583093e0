package signer

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// lateStore runs before, once, when the keeper on it is about to keep a
// verifier set it signed: what another replica, or a restore, does to the
// store in the window between the keeper's read and its write.
type lateStore struct {
	Store
	mu     sync.Mutex
	before func()
}

func (s *lateStore) arm(f func()) { s.mu.Lock(); s.before = f; s.mu.Unlock() }

func (s *lateStore) PutVerifierSet(ctx context.Context, v store.SignerSetID, raw []byte) error {
	s.mu.Lock()
	f := s.before
	s.before = nil
	s.mu.Unlock()
	if f != nil {
		f()
	}
	return s.Store.PutVerifierSet(ctx, v, raw)
}

// lateReplicas are two replicas of one SQLite store: a keeps the sets it
// signs through late, so what b does in late's window lands between a's
// read and a's write.
func lateReplicas(t *testing.T) (a, b *Keeper, late *lateStore) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "muster.db")
	sealed, _ := NewSealed(seal.StorageKey{3})
	late = &lateStore{Store: openSQLite(t, path)}
	a = NewKeeper(late, sealed, &auditLog{}, "prod-a3f2e1", 0)
	b = NewKeeper(openSQLite(t, path), sealed, &auditLog{}, "prod-a3f2e1", 0)
	return a, b, late
}

// TestStaleReplicaServesTheCurrentSet: replica a reads the signers at
// version 1 and signs that set; before it keeps it, replica b stages a
// signer (version 2, its set kept, and version 1's before its step). a's
// set of version 1 is no longer current: a must serve version 2's. Before, a kept its set (the put was
// not conditional on the store's version) and served version 1 while the
// store was at 2.
func TestStaleReplicaServesTheCurrentSet(t *testing.T) {
	ctx := t.Context()
	who := Actor{Name: "ops"}
	a, b, late := lateReplicas(t)
	if _, err := b.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	late.arm(func() {
		if _, err := b.Stage(ctx, who, time.Hour, 24*time.Hour); err != nil {
			t.Error(err)
		}
	})
	v, raw := setVersion(t, a)
	id, err := b.st.SignerSetID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v != id.Version || v != 2 {
		t.Fatalf("a served version %d, the store is at %d (want 2)", v, id.Version)
	}
	if kept, _ := b.kept(ctx, 2); string(kept) != string(raw) {
		t.Fatal("a served a set other than the one the store keeps for version 2")
	}
	// Version 1's set is kept by b's stage, before its step: a's, signed
	// for a version gone by the time it came to keep it, is refused.
	if sets, err := b.st.VerifierSets(ctx, 0, 10); err != nil || len(sets) != 2 || sets[0].Version != 1 || sets[1].Version != 2 {
		t.Fatalf("kept %d sets (%v); want versions 1 and 2", len(sets), err)
	}
}

// TestStaleReplicaKeepsNothingInARestoredStore: replica a stages a signer
// S1 (version 2) and signs its set; before it keeps it, the store is
// restored under it from a backup at version 1, and another replica
// stages S2 there (version 2 again, another step). a's set names S1,
// which the store no longer holds: it must not be kept, neither above
// the restored store's version nor at the version it reaches again, and
// every replica serves the set naming S2. Before, a's set landed in the
// restored store at version 2, above its version 1, and the restored
// store, stepped to 2, kept and served it: agents took S1.
func TestStaleReplicaKeepsNothingInARestoredStore(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	who := Actor{Name: "ops"}
	live := filepath.Join(dir, "muster.db")
	sw := &swappedStore{cur: openSQLite(t, live)}
	late := &lateStore{Store: sw}
	a, sealed := firstKeeper(t, late, 3, &auditLog{})
	if v, _ := setVersion(t, a); v != 1 {
		t.Fatalf("version %d, want 1", v)
	}
	backup := filepath.Join(dir, "backup.db")
	copyDB(t, live, backup)
	restored := openSQLite(t, backup)
	late.arm(func() {
		sw.restore(restored)
		if v, err := restored.SignerSetID(ctx); err != nil || v.Version != 1 {
			t.Errorf("restored store at %+v (%v), want version 1", v, err)
		}
	})
	res, err := a.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s1, _ := rotationOf(res)
	if sets, err := restored.VerifierSets(ctx, 1, 10); err != nil || len(sets) != 0 {
		t.Errorf("the restored store, at version 1, keeps %d sets above it (%v), the first at %d", len(sets), err, sets[0].Version)
	}
	if v, _ := setVersion(t, a); v != 1 {
		t.Errorf("a serves version %d of the restored store at 1", v)
	}
	other := NewKeeper(restored, sealed, &auditLog{}, "prod-a3f2e1", 0)
	res, err = other.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := rotationOf(res)
	for name, k := range map[string]*Keeper{"a": a, "other": other} {
		v, raw := setVersion(t, k)
		if v != 2 || !names(t, raw, s2) || names(t, raw, s1) {
			t.Fatalf("%s serves version %d naming S2 %v, S1 %v; want version 2 naming S2 only", name, v, names(t, raw, s2), names(t, raw, s1))
		}
	}
}

// TestStepKeepsTheSetItLeaves: replica a stages B (version 2) and, before
// it keeps that set, replica b activates B (version 3). a's set of
// version 2 is refused (no longer current), so b keeps version 2's set
// before its step: an agent holding version 1, which does not know B,
// takes the chain 2, 3 (3 is signed by B, staged in 2). With the set of
// version 2 never kept, the chain would be 3 alone, which that agent
// refuses: B signs it.
func TestStepKeepsTheSetItLeaves(t *testing.T) {
	ctx := t.Context()
	who := Actor{Name: "ops"}
	a, b, late := lateReplicas(t)
	if _, err := a.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	agent, _ := NewTrust(nil, nil)
	raw, err := a.VerifierSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Accept(raw, time.Now()); err != nil || agent.Version() != 1 {
		t.Fatalf("agent at %d: %v", agent.Version(), err)
	}
	late.arm(func() {
		if _, err := b.Activate(ctx, who); err != nil {
			t.Errorf("activate through b: %v", err)
		}
	})
	if _, err := a.Stage(ctx, who, time.Hour, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if v, _ := setVersion(t, a); v != 3 {
		t.Fatalf("a serves version %d, want 3", v)
	}
	chain, err := a.Chain(ctx, agent.Version())
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.AcceptChain(chain, time.Now()); err != nil || agent.Version() != 3 {
		t.Fatalf("the agent holding version 1 took the chain of %d sets to version %d: %v; want 3", len(chain), agent.Version(), err)
	}
}
