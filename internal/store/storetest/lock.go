package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// lockFixture inserts locks whose expiry is relative to the store clock and
// returns them by ID. The expired ones expired an hour ago, the live ones
// expire in an hour or never, so no clock skew between the test and the
// store can matter.
func lockFixture(t *testing.T, ctx context.Context, s store.Store) map[string]store.Lock {
	t.Helper()
	now, err := s.Now(ctx)
	mustNil(t, "Now", err)
	now = now.UTC().Truncate(time.Microsecond)
	mk := func(id, kind, target string, age, expiresIn time.Duration) store.Lock {
		l := store.Lock{
			ID: id, Kind: kind, Target: target,
			Reason: "reason " + id, CreatedBy: "admin",
			CreatedAt: now.Add(-age),
		}
		if expiresIn != 0 {
			l.ExpiresAt = now.Add(expiresIn)
		}
		return l
	}
	locks := []store.Lock{
		mk("forever", store.LockNode, "node-1", 5*time.Hour, 0),
		mk("live", store.LockToken, "tok-1", 4*time.Hour, time.Hour),
		mk("expired", store.LockInstance, "i-1", 3*time.Hour, -time.Hour),
		mk("admin-expired", store.LockAdmin, "alice", 2*time.Hour, -time.Hour),
		mk("admin-live", store.LockAdmin, "alice", time.Hour, time.Hour),
	}
	byID := map[string]store.Lock{}
	for _, l := range locks {
		mustNil(t, "InsertLock "+l.ID, s.InsertLock(ctx, l, link(record("lock.create"))))
		byID[l.ID] = l
	}
	return byID
}

func lockCases() []testCase {
	var (
		node1    = store.LockTarget{Kind: store.LockNode, Target: "node-1"}
		tok1     = store.LockTarget{Kind: store.LockToken, Target: "tok-1"}
		inst1    = store.LockTarget{Kind: store.LockInstance, Target: "i-1"}
		alice    = store.LockTarget{Kind: store.LockAdmin, Target: "alice"}
		node2    = store.LockTarget{Kind: store.LockNode, Target: "node-2"}
		tok2     = store.LockTarget{Kind: store.LockToken, Target: "tok-2"}
		key1     = store.LockTarget{Kind: store.LockPublicKey, Target: "pk-1"}
		nodeInst = store.LockTarget{Kind: store.LockInstance, Target: "node-1"}
	)
	cases := []testCase{
		{"empty", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.ListLocks(ctx)
			mustNil(t, "ListLocks", err)
			if len(got) != 0 {
				t.Errorf("ListLocks on an empty store = %v, want none", got)
			}
			_, err = s.FindAnyLock(ctx, []store.LockTarget{node1})
			wantErr(t, "FindAnyLock", err, store.ErrNotFound)
		}},
		{"list hides expired, oldest first", func(t *testing.T, ctx context.Context, s store.Store) {
			l := lockFixture(t, ctx, s)
			got, err := s.ListLocks(ctx)
			mustNil(t, "ListLocks", err)
			wantEqual(t, "ListLocks", got, []store.Lock{l["forever"], l["live"], l["admin-live"]})
		}},
		{"duplicate id conflicts", func(t *testing.T, ctx context.Context, s store.Store) {
			l := lockFixture(t, ctx, s)
			dup := l["forever"]
			dup.Kind, dup.Target = store.LockPublicKey, "pk-1"
			err := s.InsertLock(ctx, dup, link(record("lock.create")))
			wantErr(t, "InsertLock duplicate", err, store.ErrConflict)
			_, err = s.FindAnyLock(ctx, []store.LockTarget{key1})
			wantErr(t, "FindAnyLock after conflict", err, store.ErrNotFound)
		}},
		{"racing inserts of one id make one lock", func(t *testing.T, ctx context.Context, s store.Store) {
			// The authority's stale join-state lock relies on this: its ID
			// is the token's, and of many racing writers exactly one
			// writes, the others are told ErrConflict.
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			const racers = 24
			errs := make(chan error, racers)
			start := make(chan struct{})
			for i := range racers {
				go func() {
					<-start
					errs <- s.InsertLock(ctx, store.Lock{ID: "lock-stale-1", Kind: store.LockToken, Target: "tok-1",
						Reason: fmt.Sprintf("racer %d", i), CreatedBy: "authority", CreatedAt: now.UTC().Truncate(time.Microsecond)}, link(record("lock.create")))
				}()
			}
			close(start)
			won := 0
			for range racers {
				switch err := <-errs; {
				case err == nil:
					won++
				case !errors.Is(err, store.ErrConflict):
					t.Errorf("a racing InsertLock: %v, want nil or ErrConflict", err)
				}
			}
			got, err := s.ListLocks(ctx)
			mustNil(t, "ListLocks", err)
			if won != 1 || len(got) != 1 {
				t.Fatalf("%d racing inserts of one lock ID: %d succeeded, %d rows (%v); want 1 and 1", racers, won, len(got), got)
			}
		}},
		{"delete", func(t *testing.T, ctx context.Context, s store.Store) {
			l := lockFixture(t, ctx, s)
			mustNil(t, "DeleteLock", s.DeleteLock(ctx, "live", link(record("lock.delete"))))
			_, err := s.FindAnyLock(ctx, []store.LockTarget{tok1})
			wantErr(t, "FindAnyLock after delete", err, store.ErrNotFound)
			got, err := s.ListLocks(ctx)
			mustNil(t, "ListLocks", err)
			wantEqual(t, "ListLocks", got, []store.Lock{l["forever"], l["admin-live"]})
			err = s.DeleteLock(ctx, "live", link(record("lock.delete")))
			wantErr(t, "DeleteLock twice", err, store.ErrNotFound)
		}},
		{"a lock is created and deleted with its audit record, one each", func(t *testing.T, ctx context.Context, s store.Store) {
			seq := auditSeq(t, ctx, s)
			lockFixture(t, ctx, s)
			mustNil(t, "DeleteLock", s.DeleteLock(ctx, "live", link(record("lock.delete"))))
			wantErr(t, "DeleteLock twice", s.DeleteLock(ctx, "live", link(record("lock.delete"))), store.ErrNotFound)
			wantErr(t, "InsertLock of an ID held", s.InsertLock(ctx, store.Lock{ID: "forever", Kind: store.LockNode, Target: "node-9",
				CreatedBy: "admin", CreatedAt: storeNow(t, ctx, s)}, link(record("lock.create"))), store.ErrConflict)
			// Five created, one deleted; the refused writes left none.
			if got := auditSeq(t, ctx, s); got != seq+6 {
				t.Fatalf("audit chain holds %d records; want %d", got, seq+6)
			}
			recs, err := s.ListAudit(ctx, store.AuditFilter{Action: "lock.*"})
			mustNil(t, "ListAudit", err)
			if len(recs) != 6 || recs[5].Action != "lock.delete" {
				t.Fatalf("lock records %+v; want 5 lock.create and a lock.delete", recs)
			}
		}},
		{"a lock whose audit record cannot be written is neither created nor deleted", func(t *testing.T, ctx context.Context, s store.Store) {
			lockFixture(t, ctx, s)
			// ListLocks leaves out the expired lock; its delete at the
			// end shows it stayed.
			all := func() any {
				got, err := s.ListLocks(ctx)
				mustNil(t, "ListLocks", err)
				return got
			}
			now := storeNow(t, ctx, s)
			wantUnaudited(t, ctx, s, "lock.create", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.InsertLock(ctx, store.Lock{ID: "new", Kind: store.LockNode, Target: "node-2", CreatedBy: "admin", CreatedAt: now}, audit)
			}, all)
			_, err := s.FindAnyLock(ctx, []store.LockTarget{node2})
			wantErr(t, "FindAnyLock of the unaudited lock", err, store.ErrNotFound)
			for _, id := range []string{"live", "expired"} {
				wantUnaudited(t, ctx, s, "lock.delete", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
					return s.DeleteLock(ctx, id, audit)
				}, all)
			}
			_, err = s.FindAnyLock(ctx, []store.LockTarget{tok1})
			mustNil(t, "FindAnyLock of the lock an unaudited delete left", err)
			// Both are still written with a record: the expired lock is
			// still there to delete.
			mustNil(t, "DeleteLock expired", s.DeleteLock(ctx, "expired", link(record("lock.delete"))))
			mustNil(t, "InsertLock new", s.InsertLock(ctx, store.Lock{ID: "new", Kind: store.LockNode, Target: "node-2", CreatedBy: "admin", CreatedAt: now}, link(record("lock.create"))))
		}},
		{"locks created and deleted beside other appends keep the chain whole", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			const n = 6
			won := raceAppends(t, ctx, s, n, func(i int) error {
				return s.InsertLock(ctx, store.Lock{ID: fmt.Sprintf("race-%d", i%3), Kind: store.LockNode, Target: "node-1", CreatedBy: "admin", CreatedAt: now},
					link(record("lock.create")))
			})
			if won != 3 {
				t.Fatalf("%d of %d inserts of 3 IDs succeeded; want 3", won, n)
			}
			won = raceAppends(t, ctx, s, n, func(i int) error {
				return s.DeleteLock(ctx, fmt.Sprintf("race-%d", i%3), link(record("lock.delete")))
			})
			if won != 3 {
				t.Fatalf("%d of %d deletes of 3 locks succeeded; want 3", won, n)
			}
		}},
		{"lock end is the latest end of the locks in force", func(t *testing.T, ctx context.Context, s store.Store) {
			// FindAnyLock names the lock on the earliest target; the
			// refusal ends when the last lock that applies does.
			l := lockFixture(t, ctx, s)
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			now = now.UTC().Truncate(time.Microsecond)
			for _, x := range []store.Lock{
				{ID: "key-late", Kind: store.LockPublicKey, Target: "pk-1", Reason: "r", CreatedBy: "admin", CreatedAt: now, ExpiresAt: now.Add(3 * time.Hour)},
				{ID: "inst-soon", Kind: store.LockInstance, Target: "i-1", Reason: "r", CreatedBy: "admin", CreatedAt: now, ExpiresAt: now.Add(2 * time.Hour)},
				{ID: "inst-past", Kind: store.LockInstance, Target: "i-1", Reason: "r", CreatedBy: "admin", CreatedAt: now, ExpiresAt: now.Add(-time.Minute)},
			} {
				mustNil(t, "InsertLock "+x.ID, s.InsertLock(ctx, x, link(record("lock.create"))))
			}
			for _, tc := range []struct {
				name    string
				targets []store.LockTarget
				want    time.Time
				err     error
			}{
				{"one lock", []store.LockTarget{tok1}, l["live"].ExpiresAt, nil},
				{"the latest of three, the first found ending first", []store.LockTarget{tok1, inst1, key1}, now.Add(3 * time.Hour), nil},
				{"a lock without end", []store.LockTarget{tok1, node1, key1}, time.Time{}, nil},
				{"expired locks do not count", []store.LockTarget{tok2, inst1}, now.Add(2 * time.Hour), nil},
				{"none in force", []store.LockTarget{node2, tok2}, time.Time{}, store.ErrNotFound},
				{"no targets", nil, time.Time{}, store.ErrNotFound},
			} {
				got, err := s.LockEnd(ctx, tc.targets)
				if tc.err != nil {
					wantErr(t, "LockEnd "+tc.name, err, tc.err)
					continue
				}
				mustNil(t, "LockEnd "+tc.name, err)
				if !got.Equal(tc.want) {
					t.Errorf("LockEnd %s = %v, want %v", tc.name, got, tc.want)
				}
			}
			if f, err := s.FindAnyLock(ctx, []store.LockTarget{tok1, inst1, key1}); err != nil || f.ID != "live" {
				t.Errorf("FindAnyLock = %v, %v; want the lock on the first target, live", f.ID, err)
			}
		}},
		{"delete missing", func(t *testing.T, ctx context.Context, s store.Store) {
			lockFixture(t, ctx, s)
			err := s.DeleteLock(ctx, "nope", link(record("lock.delete")))
			wantErr(t, "DeleteLock", err, store.ErrNotFound)
		}},
		{"delete expired", func(t *testing.T, ctx context.Context, s store.Store) {
			// An expired lock still exists until deleted.
			lockFixture(t, ctx, s)
			mustNil(t, "DeleteLock", s.DeleteLock(ctx, "expired", link(record("lock.delete"))))
			err := s.DeleteLock(ctx, "expired", link(record("lock.delete")))
			wantErr(t, "DeleteLock twice", err, store.ErrNotFound)
		}},
		{"find oldest on one target", func(t *testing.T, ctx context.Context, s store.Store) {
			l := lockFixture(t, ctx, s)
			newer := l["forever"]
			newer.ID, newer.CreatedAt = "newer", newer.CreatedAt.Add(time.Hour)
			older := newer
			older.ID, older.CreatedAt = "older", l["forever"].CreatedAt.Add(-time.Hour)
			mustNil(t, "InsertLock newer", s.InsertLock(ctx, newer, link(record("lock.create"))))
			mustNil(t, "InsertLock older", s.InsertLock(ctx, older, link(record("lock.create"))))
			got, err := s.FindAnyLock(ctx, []store.LockTarget{tok2, node1})
			mustNil(t, "FindAnyLock", err)
			wantEqual(t, "FindAnyLock", got, older)
		}},
	}

	finds := []struct {
		name    string
		targets []store.LockTarget
		want    string // lock ID; "" for ErrNotFound
	}{
		{"find without expiry", []store.LockTarget{node1}, "forever"},
		{"find unexpired", []store.LockTarget{tok1}, "live"},
		{"find ignores expired", []store.LockTarget{inst1}, ""},
		{"find skips expired for live", []store.LockTarget{alice}, "admin-live"},
		{"find matches kind", []store.LockTarget{nodeInst}, ""},
		{"find matches target exactly", []store.LockTarget{{Kind: store.LockNode, Target: "node-"}}, ""},
		{"find matches target case", []store.LockTarget{{Kind: store.LockNode, Target: "NODE-1"}}, ""},
		{"find no targets", nil, ""},
		{"find none of several", []store.LockTarget{node2, inst1, nodeInst, tok2, key1}, ""},
		{"find one of several", []store.LockTarget{node2, key1, tok1, tok2}, "live"},
		{"find skips an expired target", []store.LockTarget{inst1, tok1}, "live"},
		// live is the newer lock: position, not age, decides.
		{"find first target first", []store.LockTarget{tok1, node1}, "live"},
		{"find first target first, reversed", []store.LockTarget{node1, tok1}, "forever"},
		{"find repeated target", []store.LockTarget{node2, alice, alice}, "admin-live"},
	}
	for _, f := range finds {
		cases = append(cases, testCase{f.name, func(t *testing.T, ctx context.Context, s store.Store) {
			l := lockFixture(t, ctx, s)
			got, err := s.FindAnyLock(ctx, f.targets)
			if f.want == "" {
				wantErr(t, "FindAnyLock", err, store.ErrNotFound)
				return
			}
			mustNil(t, "FindAnyLock", err)
			wantEqual(t, "FindAnyLock", got, l[f.want])
		}})
	}
	return cases
}
