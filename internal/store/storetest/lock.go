package storetest

import (
	"context"
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
		mustNil(t, "InsertLock "+l.ID, s.InsertLock(ctx, l))
		byID[l.ID] = l
	}
	return byID
}

func lockCases() []testCase {
	cases := []testCase{
		{"empty", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.ListLocks(ctx)
			mustNil(t, "ListLocks", err)
			if len(got) != 0 {
				t.Errorf("ListLocks on an empty store = %v, want none", got)
			}
			_, err = s.FindLock(ctx, store.LockNode, "node-1")
			wantErr(t, "FindLock", err, store.ErrNotFound)
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
			err := s.InsertLock(ctx, dup)
			wantErr(t, "InsertLock duplicate", err, store.ErrConflict)
			_, err = s.FindLock(ctx, store.LockPublicKey, "pk-1")
			wantErr(t, "FindLock after conflict", err, store.ErrNotFound)
		}},
		{"delete", func(t *testing.T, ctx context.Context, s store.Store) {
			l := lockFixture(t, ctx, s)
			mustNil(t, "DeleteLock", s.DeleteLock(ctx, "live"))
			_, err := s.FindLock(ctx, store.LockToken, "tok-1")
			wantErr(t, "FindLock after delete", err, store.ErrNotFound)
			got, err := s.ListLocks(ctx)
			mustNil(t, "ListLocks", err)
			wantEqual(t, "ListLocks", got, []store.Lock{l["forever"], l["admin-live"]})
			err = s.DeleteLock(ctx, "live")
			wantErr(t, "DeleteLock twice", err, store.ErrNotFound)
		}},
		{"delete missing", func(t *testing.T, ctx context.Context, s store.Store) {
			lockFixture(t, ctx, s)
			err := s.DeleteLock(ctx, "nope")
			wantErr(t, "DeleteLock", err, store.ErrNotFound)
		}},
		{"delete expired", func(t *testing.T, ctx context.Context, s store.Store) {
			// An expired lock still exists until deleted.
			lockFixture(t, ctx, s)
			mustNil(t, "DeleteLock", s.DeleteLock(ctx, "expired"))
			err := s.DeleteLock(ctx, "expired")
			wantErr(t, "DeleteLock twice", err, store.ErrNotFound)
		}},
	}

	finds := []struct {
		name         string
		kind, target string
		want         string // lock ID; "" for ErrNotFound
	}{
		{"find without expiry", store.LockNode, "node-1", "forever"},
		{"find unexpired", store.LockToken, "tok-1", "live"},
		{"find ignores expired", store.LockInstance, "i-1", ""},
		{"find skips expired for live", store.LockAdmin, "alice", "admin-live"},
		{"find matches kind", store.LockInstance, "node-1", ""},
		{"find matches target exactly", store.LockNode, "node-", ""},
		{"find matches target case", store.LockNode, "NODE-1", ""},
	}
	for _, f := range finds {
		cases = append(cases, testCase{f.name, func(t *testing.T, ctx context.Context, s store.Store) {
			l := lockFixture(t, ctx, s)
			got, err := s.FindLock(ctx, f.kind, f.target)
			if f.want == "" {
				wantErr(t, "FindLock", err, store.ErrNotFound)
				return
			}
			mustNil(t, "FindLock", err)
			wantEqual(t, "FindLock", got, l[f.want])
		}})
	}
	return cases
}
