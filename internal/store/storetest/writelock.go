package storetest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// wantLocked fails the test unless err is the refusal of a write by lock
// l: ErrLocked, as a *store.LockedError naming it.
func wantLocked(t *testing.T, what string, err error, l store.Lock) {
	t.Helper()
	var le *store.LockedError
	switch {
	case !errors.Is(err, store.ErrLocked):
		t.Fatalf("%s: %v, want an error wrapping ErrLocked", what, err)
	case !errors.As(err, &le):
		t.Fatalf("%s: %v is no *store.LockedError", what, err)
	case le.Lock.ID != l.ID || le.Lock.Kind != l.Kind || le.Lock.Target != l.Target:
		t.Fatalf("%s: refused by lock %+v, want %s on %s %s", what, le.Lock, l.ID, l.Kind, l.Target)
	}
}

// lockOn inserts a lock in force on target, created by the store clock.
func lockOn(t *testing.T, ctx context.Context, s store.Store, id string, target store.LockTarget) store.Lock {
	t.Helper()
	l := store.Lock{ID: id, Kind: target.Kind, Target: target.Target, Reason: "r " + id, CreatedBy: "admin",
		CreatedAt: storeNow(t, ctx, s)}
	mustNil(t, "InsertLock "+id, s.InsertLock(ctx, l, link(record("lock.create"))))
	return l
}

// writeLockCases: a lock created between a join's or renewal's read and
// its write refuses the write (docs/threat-model.md: a lock stops
// renewals at once), on every target the read checked, and nothing is
// written. Each case reads first, as enroll does, then locks, then
// commits.
func writeLockCases() []testCase {
	var cases []testCase
	// Renewals: each of RenewalLockTargets.
	for i, name := range []string{"node", "instance", "token", "the key held", "the key asked for"} {
		cases = append(cases, testCase{"a lock on " + name + " created after the read refuses the renewal", func(t *testing.T, ctx context.Context, s store.Store) {
			j, in := admit(t, ctx, s, "node-1", "i1", storeNow(t, ctx, s))
			r := renewalOf(in, "key-2", storeNow(t, ctx, s))
			asked := hex.EncodeToString(r.Certificate.PublicKey)
			rd, err := s.ReadRenewal(ctx, j.Certificate.Serial, []string{asked})
			mustNil(t, "ReadRenewal", err)
			if !rd.CertificateFound || !rd.InstanceFound || rd.Locked {
				t.Fatalf("ReadRenewal = %+v, want the record and instance, unlocked", rd)
			}
			targets := store.RenewalLockTargets(rd.Certificate, rd.Instance, []string{asked})
			if len(targets) != 5 {
				t.Fatalf("RenewalLockTargets = %v, want five", targets)
			}
			r.LockTargets = targets
			before := snapshot(t, ctx, s, "node-1")
			l := lockOn(t, ctx, s, "l-1", targets[i])
			_, err = s.CommitRenewal(ctx, r)
			wantLocked(t, "CommitRenewal", err, l)
			wantEqual(t, "state after the refused renewal", snapshot(t, ctx, s, "node-1"), before)

			// The lock lifted, the same renewal goes through.
			mustNil(t, "DeleteLock", s.DeleteLock(ctx, l.ID, link(record("lock.delete"))))
			got, err := s.CommitRenewal(ctx, r)
			mustNil(t, "CommitRenewal after the lock's deletion", err)
			wantEqual(t, "CommitRenewal after the lock's deletion", got, renewed(in, r))
		}})
	}
	cases = append(cases,
		testCase{"only a lock in force on a named target refuses a renewal", func(t *testing.T, ctx context.Context, s store.Store) {
			_, in := admit(t, ctx, s, "node-1", "i1", storeNow(t, ctx, s))
			now := storeNow(t, ctx, s)
			insertLocksBeside(t, ctx, s, now)
			r := renewalOf(in, "key-2", now)
			r.LockTargets = []store.LockTarget{{Kind: store.LockNode, Target: "node-1"}, {Kind: store.LockInstance, Target: "i1"},
				{Kind: store.LockPublicKey, Target: ""}}
			_, err := s.CommitRenewal(ctx, r)
			mustNil(t, "CommitRenewal past locks not in force on its targets", err)
		}},
		testCase{"a renewal that lost its race is a conflict, locked or not", func(t *testing.T, ctx context.Context, s store.Store) {
			_, in := admit(t, ctx, s, "node-1", "i1", storeNow(t, ctx, s))
			_, err := s.CommitRenewal(ctx, renewalOf(in, "key-2", storeNow(t, ctx, s)))
			mustNil(t, "CommitRenewal", err)
			lockOn(t, ctx, s, "l-1", store.LockTarget{Kind: store.LockNode, Target: "node-1"})
			r := renewalOf(in, "key-3", storeNow(t, ctx, s))
			r.LockTargets = []store.LockTarget{{Kind: store.LockNode, Target: "node-1"}}
			_, err = s.CommitRenewal(ctx, r)
			wantErr(t, "a stale renewal of a locked node", err, store.ErrConflict)
			r.InstanceID, r.Certificate.InstanceID = "i-none", "i-none"
			_, err = s.CommitRenewal(ctx, r)
			wantErr(t, "a renewal of no instance", err, store.ErrNotFound)
		}},
		testCase{"a lock created after the read refuses a refresh, and its key rotation", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 1, store.RecoveryStandard))
			j := bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...)
			in := mustJoin(t, ctx, s, j).Instance
			rd, err := s.ReadRenewal(ctx, j.Certificate.Serial, []string{"key-1", "key-2"})
			mustNil(t, "ReadRenewal", err)
			r := renewalOf(in, "k2", now)
			r.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-1", Expected: "key-1", PublicKey: "key-2", Rotate: true}}
			r.LockTargets = store.RenewalLockTargets(rd.Certificate, rd.Instance, []string{"key-1", "key-2"})
			before, bk := snapshot(t, ctx, s, "node-1"), getBK(t, ctx, s, "bot-1")
			l := lockOn(t, ctx, s, "l-new-key", store.LockTarget{Kind: store.LockPublicKey, Target: "key-2"})
			_, err = s.CommitRenewal(ctx, r)
			wantLocked(t, "CommitRenewal of the refresh", err, l)
			wantEqual(t, "state after the refused refresh", snapshot(t, ctx, s, "node-1"), before)
			wantEqual(t, "binding after the refused refresh", getBK(t, ctx, s, "bot-1"), bk)
		}},
	)

	// Joins: each target a join's read checks (node, token, the key to
	// certify, and a bound key).
	joinTargets := []store.LockTarget{{Kind: store.LockNode, Target: "node-1"}, {Kind: store.LockToken, Target: "tok-1"},
		{Kind: store.LockPublicKey, Target: hex.EncodeToString(pubKey("key-1"))}}
	for i, name := range []string{"node", "token", "key"} {
		cases = append(cases, testCase{"a lock on the " + name + " created after the read refuses the join", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("tok-1", 1, time.Time{}, time.Hour))
			rd, err := s.ReadJoin(ctx, "tok-1", "node-1", joinTargets)
			mustNil(t, "ReadJoin", err)
			if !rd.TokenFound || rd.NodeFound || rd.Locked {
				t.Fatalf("ReadJoin = %+v, want the token, no node, no lock", rd)
			}
			j := newJoin("tok-1", "node-1", "inst-1", "key-1", storeNow(t, ctx, s))
			j.LockTargets = joinTargets
			before := snapshot(t, ctx, s, "node-1")
			l := lockOn(t, ctx, s, "l-1", joinTargets[i])
			_, err = s.CommitJoin(ctx, j)
			wantLocked(t, "CommitJoin", err, l)
			wantEqual(t, "state after the refused join", snapshot(t, ctx, s, "node-1"), before)

			mustNil(t, "DeleteLock", s.DeleteLock(ctx, l.ID, link(record("lock.delete"))))
			mustJoin(t, ctx, s, j)
		}})
	}
	cases = append(cases,
		testCase{"a lock refuses a join that would be a retry", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("tok-1", 1, time.Time{}, time.Hour))
			j := newJoin("tok-1", "node-1", "inst-1", "key-1", storeNow(t, ctx, s))
			j.RetryWindow = time.Hour
			mustJoin(t, ctx, s, j)
			j.LockTargets = append(joinTargets, store.LockTarget{Kind: store.LockInstance, Target: "inst-1"})
			l := lockOn(t, ctx, s, "l-1", store.LockTarget{Kind: store.LockInstance, Target: "inst-1"})
			_, err := s.CommitJoin(ctx, j)
			wantLocked(t, "CommitJoin of a retry", err, l)
		}},
		testCase{"a lock in force refuses a join whatever else would refuse it", func(t *testing.T, ctx context.Context, s store.Store) {
			// The lock is named, not the spent token, the node held or
			// the ticket used: the operator's way out is the lock's.
			insertTokens(t, ctx, s, token("tok-1", 1, time.Time{}, time.Hour), token("tok-2", 0, time.Time{}, time.Hour))
			mustJoin(t, ctx, s, newJoin("tok-1", "node-1", "inst-1", "key-1", storeNow(t, ctx, s)))
			l := lockOn(t, ctx, s, "l-1", store.LockTarget{Kind: store.LockPublicKey, Target: hex.EncodeToString(pubKey("key-2"))})
			targets := func(tok, node string) []store.LockTarget {
				return []store.LockTarget{{Kind: store.LockNode, Target: node}, {Kind: store.LockToken, Target: tok},
					{Kind: store.LockPublicKey, Target: hex.EncodeToString(pubKey("key-2"))}}
			}
			spent := newJoin("tok-1", "node-2", "inst-2", "key-2", storeNow(t, ctx, s))
			spent.LockTargets = targets("tok-1", "node-2")
			taken := newJoin("tok-2", "node-1", "inst-3", "key-2", storeNow(t, ctx, s))
			taken.LockTargets = targets("tok-2", "node-1")
			// As after a read that found node-1 free (a stale guess).
			takenRead := taken
			takenRead.NodeFreeAtRead = true
			before := snapshot(t, ctx, s, "node-1", "node-2")
			for _, c := range []struct {
				what string
				j    store.Join
			}{{"CommitJoin with a spent token", spent}, {"CommitJoin of a node held", taken},
				{"CommitJoin of a node held, read free", takenRead}} {
				_, err := s.CommitJoin(ctx, c.j)
				wantLocked(t, c.what, err, l)
			}
			wantEqual(t, "state after the refused joins", snapshot(t, ctx, s, "node-1", "node-2"), before)

			// Without the lock, each is refused for what it is.
			mustNil(t, "DeleteLock", s.DeleteLock(ctx, l.ID, link(record("lock.delete"))))
			_, err := s.CommitJoin(ctx, spent)
			wantErr(t, "CommitJoin with a spent token, unlocked", err, store.ErrTokenSpent)
			_, err = s.CommitJoin(ctx, taken)
			wantErr(t, "CommitJoin of a node held, unlocked", err, store.ErrNodeTaken)
			_, err = s.CommitJoin(ctx, takenRead)
			wantErr(t, "CommitJoin of a node held, read free, unlocked", err, store.ErrNodeTaken)
			wantEqual(t, "state after the refused joins, unlocked", snapshot(t, ctx, s, "node-1", "node-2"), before)
		}},
		testCase{"only a lock in force on a named target refuses a join", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("tok-1", 0, time.Time{}, time.Hour))
			now := storeNow(t, ctx, s)
			insertLocksBeside(t, ctx, s, now)
			j := newJoin("tok-1", "node-1", "inst-1", "key-1", now)
			j.LockTargets = []store.LockTarget{{Kind: store.LockNode, Target: "node-1"}, {Kind: store.LockToken, Target: "tok-1"},
				{Kind: store.LockPublicKey, Target: ""}}
			mustJoin(t, ctx, s, j)
		}},
		testCase{"a lock created after the read refuses a bound-keypair recovery", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, bkToken("bot-1", "node-1", 5, store.RecoveryStandard))
			mustJoin(t, ctx, s, bkJoin("bot-1", "node-1", "i1", now, register("bot-1", "key-1")...))
			targets := []store.LockTarget{{Kind: store.LockNode, Target: "node-1"}, {Kind: store.LockToken, Target: "bot-1"},
				{Kind: store.LockPublicKey, Target: "key-1"}}
			rd, err := s.ReadJoin(ctx, "bot-1", "", targets)
			mustNil(t, "ReadJoin", err)
			if rd.Locked {
				t.Fatalf("ReadJoin found lock %+v", rd.Lock)
			}
			j := bkJoin("bot-1", "node-1", "i2", now, store.Recovery{TokenID: "bot-1", ExpectedSequence: 1, Counted: true})
			j.LockTargets = targets
			before, bk := snapshot(t, ctx, s, "node-1"), getBK(t, ctx, s, "bot-1")
			l := lockOn(t, ctx, s, "l-bound-key", targets[2])
			_, err = s.CommitJoin(ctx, j)
			wantLocked(t, "CommitJoin of the recovery", err, l)
			wantEqual(t, "state after the refused recovery", snapshot(t, ctx, s, "node-1"), before)
			wantEqual(t, "binding after the refused recovery", getBK(t, ctx, s, "bot-1"), bk)
		}},
		testCase{"locks created while renewals are written: each renewal either committed before its lock or is refused", func(t *testing.T, ctx context.Context, s store.Store) {
			// Several nodes renew while their token is locked. Whatever
			// the interleaving, no renewal may commit after the lock's
			// creation returned: every renewal that started after it is
			// refused.
			const nodes = 6
			insertTokens(t, ctx, s, token("tok-s", 0, time.Time{}, time.Hour))
			ins := make([]store.Instance, nodes)
			for i := range ins {
				j := newJoin("tok-s", fmt.Sprintf("node-%d", i), fmt.Sprintf("i%d", i), fmt.Sprintf("key-%d", i), storeNow(t, ctx, s))
				ins[i] = mustJoin(t, ctx, s, j).Instance
			}
			tok := store.LockTarget{Kind: store.LockToken, Target: "tok-s"}
			locked := make(chan struct{})
			errs := concurrently(nodes+1, func(i int) error {
				if i == nodes {
					defer close(locked)
					return s.InsertLock(ctx, store.Lock{ID: "l-tok", Kind: tok.Kind, Target: tok.Target, CreatedBy: "admin",
						CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}, link(record("lock.create")))
				}
				r := renewalOf(ins[i], "next", storeNow(t, ctx, s))
				r.LockTargets = []store.LockTarget{{Kind: store.LockNode, Target: ins[i].NodeID}, {Kind: store.LockInstance, Target: ins[i].ID}, tok}
				_, err := s.CommitRenewal(ctx, r)
				return err
			})
			mustNil(t, "InsertLock", errs[nodes])
			for i, err := range errs[:nodes] {
				if err != nil && !errors.Is(err, store.ErrLocked) {
					t.Errorf("renewal %d: %v, want nil or ErrLocked", i, err)
				}
			}
			<-locked
			for i, in := range ins {
				r := renewalOf(in, "after", storeNow(t, ctx, s))
				if got, err := s.GetInstance(ctx, in.ID); err == nil && got.Generation == 1 {
					r = renewalOf(got, "after", storeNow(t, ctx, s))
				}
				r.LockTargets = []store.LockTarget{tok}
				_, err := s.CommitRenewal(ctx, r)
				wantErr(t, fmt.Sprintf("renewal %d after the lock", i), err, store.ErrLocked)
			}
		}},
	)
	return cases
}

// insertLocksBeside inserts locks that refuse nothing of node-1's (its
// instance i1, its token, its key) at now: one expired, one on another
// node, one of another kind on node-1's name, one on an empty key.
func insertLocksBeside(t *testing.T, ctx context.Context, s store.Store, now time.Time) {
	t.Helper()
	for _, l := range []store.Lock{
		{ID: "expired", Kind: store.LockNode, Target: "node-1", CreatedAt: now.Add(-time.Hour), ExpiresAt: now.Add(-time.Minute)},
		{ID: "other-node", Kind: store.LockNode, Target: "node-2", CreatedAt: now},
		{ID: "wrong-kind", Kind: store.LockInstance, Target: "node-1", CreatedAt: now},
		{ID: "empty-key", Kind: store.LockPublicKey, Target: "", CreatedAt: now},
	} {
		l.CreatedBy = "admin"
		mustNil(t, "InsertLock "+l.ID, s.InsertLock(ctx, l, link(record("lock.create"))))
	}
}
