package signer

import (
	"context"
	"crypto/ed25519"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// countingCustody counts the signatures made through it.
type countingCustody struct {
	Custody
	signs atomic.Int64
}

func (c *countingCustody) Sign(ctx context.Context, versionID string, pub ed25519.PublicKey, ref, msg []byte) ([]byte, error) {
	c.signs.Add(1)
	return c.Custody.Sign(ctx, versionID, pub, ref, msg)
}

// replicaKeepers returns two keepers on two store handles of one SQLite
// database, as two replicas share one store, counting their signatures
// together (a set is signed once by whichever replica comes first).
func replicaKeepers(t *testing.T) (a, b *Keeper, signsA *countingCustody) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "muster.db")
	open := func() *sqlite.SQLite {
		st, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	sealed, _ := NewSealed(seal.StorageKey{3})
	signsA = &countingCustody{Custody: sealed}
	a = NewKeeper(open(), signsA, &auditLog{}, "prod-a3f2e1", 0)
	b = NewKeeper(open(), signsA, &auditLog{}, "prod-a3f2e1", 0)
	return a, b, signsA
}

func setVersion(t *testing.T, k *Keeper) (int64, []byte) {
	t.Helper()
	raw, err := k.VerifierSet(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	set, err := ParseVerifierSet(raw)
	if err != nil {
		t.Fatal(err)
	}
	return set.Version, raw
}

// TestVerifierSetSignedOncePerVersion: the set of a version is signed once
// and served from then on, and every step — made through this replica or
// another — is served from the next call on, never the older set.
func TestVerifierSetSignedOncePerVersion(t *testing.T) {
	ctx := t.Context()
	a, b, signs := replicaKeepers(t)
	who := Actor{Name: "ops"}
	if _, err := b.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}

	v1, raw1 := setVersion(t, a)
	for range 5 {
		if v, raw := setVersion(t, a); v != v1 || string(raw) != string(raw1) {
			t.Fatalf("version %d, want the cached %d", v, v1)
		}
	}
	if n := signs.signs.Load(); n != 1 {
		t.Fatalf("%d signatures for six sets of one version, want 1", n)
	}

	steps := []struct {
		name string
		by   *Keeper
		step func(k *Keeper) error
	}{
		{"stage through the other replica", b, func(k *Keeper) error { _, err := k.Stage(ctx, who, time.Hour, 24*time.Hour); return err }},
		{"activate through this replica", a, func(k *Keeper) error { _, err := k.Activate(ctx, who); return err }},
		{"roll back through the other replica", b, func(k *Keeper) error { _, err := k.Rollback(ctx, who); return err }},
	}
	prev := v1
	for _, s := range steps {
		before := signs.signs.Load()
		if err := s.step(s.by); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		id, err := a.st.SignerSetID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stored := id.Version
		got, raw := setVersion(t, a)
		if got != stored || got <= prev {
			t.Fatalf("%s: served version %d, store at %d (before %d)", s.name, got, stored, prev)
		}
		set, _ := ParseVerifierSet(raw)
		snap, _ := a.Load(ctx)
		active, _ := ActiveOf(snap.Signers)
		if sa, _ := set.Active(); sa.VersionID != active.VersionID {
			t.Fatalf("%s: set names %s active, store %s", s.name, sa.VersionID, active.VersionID)
		}
		if n := signs.signs.Load() - before; n != 1 {
			t.Fatalf("%s: %d signatures, want 1 (the new version's)", s.name, n)
		}
		prev = got
	}

	// A stream that has the current version is sent nothing.
	if raw, v, err := a.SignedVerifierSet(ctx, prev); err != nil || raw != nil || v != prev {
		t.Fatalf("SignedVerifierSet(have current) = %d bytes, %d, %v", len(raw), v, err)
	}
}

// TestVerifierSetCacheNeverGoesBack: requests racing with steps never put
// an older set back in the cache, so once a version is served every later
// call serves it or a newer one.
func TestVerifierSetCacheNeverGoesBack(t *testing.T) {
	ctx := t.Context()
	a, b, _ := replicaKeepers(t)
	who := Actor{Name: "ops"}
	if _, err := b.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			var seen int64
			for {
				select {
				case <-stop:
					return
				default:
				}
				raw, v, err := a.SignedVerifierSet(ctx, -1)
				if err != nil {
					t.Error(err)
					return
				}
				set, err := ParseVerifierSet(raw)
				if err != nil || set.Version != v {
					t.Errorf("set %+v for version %d: %v", set, v, err)
					return
				}
				if v < seen {
					t.Errorf("served version %d after %d", v, seen)
					return
				}
				seen = v
			}
		})
	}
	for range 3 {
		if _, err := b.Stage(ctx, who, time.Hour, 24*time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Rollback(ctx, who); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	id, _ := a.st.SignerSetID(ctx)
	stored := id.Version
	if v, _ := setVersion(t, a); v != stored {
		t.Fatalf("served %d, store at %d", v, stored)
	}
	if c := a.signed.Load(); c == nil || c.id.Version != stored {
		t.Fatalf("cached a set of version %d, store at %d", c.id.Version, stored)
	}
}

// TestVerifierSetAfterTheStoreWentBack: a store whose version goes back
// (restored from a backup under a running authority) is served its own
// set, and the set kept for the higher version is dropped from the cache,
// so when the store is at that version again it serves the set the store
// keeps there.
func TestVerifierSetAfterTheStoreWentBack(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	sealed, _ := NewSealed(seal.StorageKey{3})
	who := Actor{Name: "ops"}
	live := filepath.Join(dir, "muster.db")
	liveStore := openSQLite(t, live)
	sw := &swappedStore{cur: liveStore}
	a := NewKeeper(sw, sealed, &auditLog{}, "prod-a3f2e1", 0)
	b := NewKeeper(openSQLite(t, live), sealed, &auditLog{}, "prod-a3f2e1", 0)
	if _, err := b.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	low, lowRaw := setVersion(t, a)
	backup := filepath.Join(dir, "backup.db")
	copyDB(t, live, backup)
	if _, err := b.Stage(ctx, who, time.Hour, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	high, _ := setVersion(t, a)
	if high != low+1 {
		t.Fatalf("served %d after a stage from %d", high, low)
	}
	sw.restore(openSQLite(t, backup))
	if v, raw := setVersion(t, a); v != low || string(raw) != string(lowRaw) {
		t.Fatalf("after the store went back: served %d, want the restored store's own set of %d", v, low)
	}
	sw.restore(liveStore)
	// The store's own set of that version is served: the one it keeps.
	v, raw := setVersion(t, a)
	if v != high {
		t.Fatalf("served %d, want %d", v, high)
	}
	if kept, _ := a.kept(ctx, high); string(kept) != string(raw) {
		t.Fatal("served a set other than the one the store keeps for its version")
	}
}
