package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// TestLockAndGuardedWriteTakeTurns: a lock's creation on one replica and
// a join's or renewal's write on another, each refused by a lock on the
// other's target, take turns. A lock inserted but not yet committed makes
// the write wait and then refuses it; with the check a NOT EXISTS alone,
// the write's snapshot did not see the uncommitted lock, and the
// renewal committed after the lock did (a certificate issued after `lock
// create` returned). And a write in flight makes the lock's creation wait
// for its commit.
func TestLockAndGuardedWriteTakeTurns(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := h[0].InsertToken(ctx, store.Token{ID: "t1", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"),
		Nonce: []byte("n"), CreatedBy: "admin", CreatedAt: now}, benchLink); err != nil {
		t.Fatal(err)
	}
	j := joinOf(1, "t1")
	if _, err := h[0].CommitJoin(ctx, j); err != nil {
		t.Fatal(err)
	}
	renewal := func(target store.LockTarget) store.Renewal {
		k := []byte("next key, 32 bytes long ........")
		return store.Renewal{InstanceID: j.Instance.ID, FromGeneration: 0, ChainPEM: []byte("chain"),
			LockTargets: []store.LockTarget{{Kind: store.LockNode, Target: j.NodeID}, target},
			Certificate: store.Certificate{Serial: "5e11", Generation: 1, PublicKey: k, NotBefore: now,
				NotAfter: now.Add(time.Hour), IssuedAt: now}}
	}
	// holdLock inserts l on replica 0 as InsertLock does, in a
	// transaction left open until the returned function commits it.
	holdLock := func(t *testing.T, l store.Lock) func() {
		t.Helper()
		tx, err := h[0].pool.p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(context.Background()) })
		if err := insertLock(ctx, tx, l); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	lockOf := func(id string, target store.LockTarget) store.Lock {
		return store.Lock{ID: id, Kind: target.Kind, Target: target.Target, CreatedBy: "admin", CreatedAt: now}
	}

	t.Run("renewal waits for a lock being created and is refused", func(t *testing.T) {
		target := store.LockTarget{Kind: store.LockToken, Target: "t1"}
		commit := holdLock(t, lockOf("l-renew", target))
		done := make(chan error, 1)
		go func() {
			_, err := h[1].CommitRenewal(ctx, renewal(target))
			done <- err
		}()
		awaitWaiters(t, h[0], 1, done, "the renewal")
		commit()
		err := <-done
		var le *store.LockedError
		if !errors.As(err, &le) || le.Lock.ID != "l-renew" {
			t.Fatalf("the renewal: %v, want the refusal by l-renew", err)
		}
		if in, err := h[0].GetInstance(ctx, j.Instance.ID); err != nil || in.Generation != 0 {
			t.Fatalf("after the refused renewal: generation %d, %v; want 0", in.Generation, err)
		}
		if err := h[0].DeleteLock(ctx, "l-renew", benchLink); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("join waits for a lock being created and is refused", func(t *testing.T) {
		target := store.LockTarget{Kind: store.LockNode, Target: "node-2"}
		commit := holdLock(t, lockOf("l-join", target))
		j2 := joinOf(2, "t1")
		j2.NodeID, j2.Certificate.NodeID = "node-2", "node-2"
		j2.LockTargets = []store.LockTarget{{Kind: store.LockToken, Target: "t1"}, target}
		done := make(chan error, 1)
		go func() {
			_, err := h[1].CommitJoin(ctx, j2)
			done <- err
		}()
		awaitWaiters(t, h[0], 1, done, "the join")
		commit()
		if err := <-done; !errors.Is(err, store.ErrLocked) {
			t.Fatalf("the join: %v, want ErrLocked", err)
		}
		if _, err := h[0].GetNode(ctx, "node-2"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetNode after the refused join: %v, want ErrNotFound", err)
		}
	})

	t.Run("a lock's creation waits for a renewal in flight", func(t *testing.T) {
		// Replica 1 holds the renewal's shared target locks as its write
		// does, in a transaction left open.
		target := store.LockTarget{Kind: store.LockInstance, Target: j.Instance.ID}
		tx, err := h[1].pool.p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		kinds, names := lockArgs([]store.LockTarget{target})
		if _, err := tx.Exec(ctx, targetLocksQuery, lockTargetClass, kinds, names); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- h[0].InsertLock(ctx, lockOf("l-wait", target), benchLink) }()
		awaitWaiters(t, h[0], 1, done, "the lock's creation")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("InsertLock: %v", err)
		}
	})
}

// TestRenewalLockCheckRoundTrips: the write's lock check travels with
// the statements a renewal sent already: two round trips with five lock
// targets, as without them, and two for a renewal a lock refuses (the
// rollback and the reason in the second).
func TestRenewalLockCheckRoundTrips(t *testing.T) {
	ctx := t.Context()
	trips := &tripCounter{}
	s, err := Open(ctx, srv.NewDatabase(t), WithTracer(trips))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := s.InsertToken(ctx, store.Token{ID: "t1", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"),
		Nonce: []byte("n"), CreatedBy: "admin", CreatedAt: now}, benchLink); err != nil {
		t.Fatal(err)
	}
	j := joinOf(1, "t1")
	res, err := s.CommitJoin(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	audit := func(h store.AuditHead) (store.AuditRecord, error) {
		return store.AuditRecord{Seq: h.Seq + 1, Time: now, Actor: "test", Action: "test", Result: "ok", PrevHash: h.Hash,
			Hash: make([]byte, 32)}, nil
	}
	in := res.Instance
	renew := func(g int64) error {
		k := []byte(fmt.Sprintf("key %d, 32 bytes long ..........", g))[:32]
		r := store.Renewal{InstanceID: in.ID, FromGeneration: g, ChainPEM: []byte("chain"), Audit: audit,
			Certificate: store.Certificate{Serial: fmt.Sprintf("5e%d", g+1), Generation: g + 1, PublicKey: k, NotBefore: now,
				NotAfter: now.Add(time.Hour), IssuedAt: now}}
		c := store.Certificate{NodeID: in.NodeID, PublicKey: in.LastPublicKey}
		r.LockTargets = store.RenewalLockTargets(c, in, []string{"ab12"})
		trips.n.Store(0)
		_, err := s.CommitRenewal(ctx, r)
		return err
	}
	if err := renew(0); err != nil {
		t.Fatal(err)
	}
	if n := trips.n.Load(); n != 2 {
		t.Errorf("a renewal checking five lock targets: %d round trips, want 2", n)
	}
	if err := s.InsertLock(ctx, store.Lock{ID: "l1", Kind: store.LockToken, Target: "t1", CreatedBy: "admin", CreatedAt: now}, benchLink); err != nil {
		t.Fatal(err)
	}
	if err := renew(1); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("the renewal after the lock: %v, want ErrLocked", err)
	}
	if n := trips.n.Load(); n != 2 {
		t.Errorf("a renewal refused by a lock: %d round trips, want 2", n)
	}
}

// insertLock is InsertLock's write (the same statements, in the same
// order) in a transaction the test holds open.
func insertLock(ctx context.Context, tx pgx.Tx, l store.Lock) error {
	if _, err := tx.Exec(ctx, targetLockQuery, lockTargetClass, l.Kind+" "+l.Target); err != nil {
		return wrap("insert lock: lock target", err)
	}
	if _, err := tx.Exec(ctx, insertLockQuery, lockArgsOf(l)...); err != nil {
		return wrap("insert lock", err)
	}
	return nil
}
