package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// SnapshotStore is a fresh store whose tables can be copied aside and put
// back, as a restore from a backup puts a store back under a replica that
// read it since. Snapshot copies the rows of tables aside; the function it
// returns replaces what the tables hold then with those rows.
type SnapshotStore struct {
	store.Store
	Snapshot func(t *testing.T, tables ...string) (restore func(t *testing.T))
}

// RunRestoredRowTests checks the single-row conditional writes in their
// restore form: a replica reads version (or number) N, the store is restored from a
// backup taken before N and written back up to N with other content, and
// the write the replica prepared from its read is refused with
// ErrConflict, writing nothing and appending no record. The version alone
// repeats; the store-clock time of the write that made the row does not.
// open returns a fresh store for each case.
func RunRestoredRowTests(t *testing.T, open func(t *testing.T) SnapshotStore) {
	t.Helper()
	for _, tc := range restoredRowCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, t.Context(), open(t))
		})
	}
}

type restoredRowCase struct {
	name string
	run  func(t *testing.T, ctx context.Context, ss SnapshotStore)
}

// afterStoreClock waits until the store clock is past at: the write after
// a restore is stamped after the one before it, as any write made a
// restore later is (the clock counts milliseconds on SQLite).
func afterStoreClock(t *testing.T, ctx context.Context, s store.Store, at time.Time) {
	t.Helper()
	for !storeNow(t, ctx, s).After(at) {
		time.Sleep(time.Millisecond)
	}
}

func restoredRowCases() []restoredRowCase {
	return []restoredRowCase{
		{"a root rotation step from a read before the restore is refused", func(t *testing.T, ctx context.Context, ss SnapshotStore) {
			s := ss.Store
			mustNil(t, "PutRootRotation", s.PutRootRotation(ctx, store.RootRotation{},
				store.RootRotation{Phase: store.RootPhaseInit, NewCertDER: []byte("root-b")}, true, link(record("ca.root_rotate"))))
			backup, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			restore := ss.Snapshot(t, "ca_root_rotation")
			next := backup
			next.Phase = store.RootPhaseUpdateAgents
			mustNil(t, "PutRootRotation before the restore", s.PutRootRotation(ctx, backup, next, false, link(record("ca.root_phase"))))
			stale, err := s.GetRootRotation(ctx) // a replica's read
			mustNil(t, "GetRootRotation", err)
			restore(t)
			afterStoreClock(t, ctx, s, stale.ChangedAt)
			// Another rotation, started again from the backup's row.
			mustNil(t, "PutRootRotation after the restore", s.PutRootRotation(ctx, backup,
				store.RootRotation{Phase: store.RootPhaseInit, NewCertDER: []byte("root-c")}, true, link(record("ca.root_rotate"))))
			again, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			if again.Version != stale.Version || again.ChangedAt.Equal(stale.ChangedAt) {
				t.Fatalf("written back up to %d at %v; the read before the restore: %d at %v; want the same version at another time",
					again.Version, again.ChangedAt, stale.Version, stale.ChangedAt)
			}
			seq := auditSeq(t, ctx, s)
			planned := stale
			planned.Phase = store.RootPhaseUpdateServers
			wantErr(t, "a step planned from the read before the restore",
				s.PutRootRotation(ctx, stale, planned, false, link(record("ca.root_phase"))), store.ErrConflict)
			got, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			wantEqual(t, "the rotation after the refused step", got, again)
			if n := auditSeq(t, ctx, s); n != seq {
				t.Fatalf("the refused step appended %d records", n-seq)
			}
			next = again
			next.Phase = store.RootPhaseUpdateAgents
			mustNil(t, "a step from the read after the restore", s.PutRootRotation(ctx, again, next, false, link(record("ca.root_phase"))))
		}},
		{"a JWT key rotation from a read before the restore is refused", func(t *testing.T, ctx context.Context, ss SnapshotStore) {
			s := ss.Store
			backup, err := s.GetJWTKey(ctx)
			mustNil(t, "GetJWTKey", err)
			restore := ss.Snapshot(t, "jwt_svid_key")
			stale, err := s.RotateJWTKey(ctx, backup, link(record("jwt.rotate")))
			mustNil(t, "RotateJWTKey before the restore", err)
			restore(t)
			afterStoreClock(t, ctx, s, stale.RotatedAt)
			again, err := s.RotateJWTKey(ctx, backup, link(record("jwt.rotate")))
			mustNil(t, "RotateJWTKey after the restore", err)
			if again.Version != stale.Version || again.RotatedAt.Equal(stale.RotatedAt) {
				t.Fatalf("rotated back up to %+v; the read before the restore %+v; want the same version at another time", again, stale)
			}
			// The version's key is the one the backup published as the
			// next; the next version's is drawn anew, so it is not the
			// one retired with the restore's lost rotations.
			if again.Salt != stale.Salt || again.PrevSalt != stale.PrevSalt || again.NextSalt == stale.NextSalt || again.NextSalt == "" {
				t.Fatalf("salts rotated back up to %+v; before the restore %+v; want the backup's next salt current and a next one drawn anew", again, stale)
			}
			seq := auditSeq(t, ctx, s)
			_, err = s.RotateJWTKey(ctx, stale, link(record("jwt.rotate")))
			wantErr(t, "a rotation from the read before the restore", err, store.ErrConflict)
			got, err := s.GetJWTKey(ctx)
			mustNil(t, "GetJWTKey", err)
			wantEqual(t, "the key after the refused rotation", got, again)
			if n := auditSeq(t, ctx, s); n != seq {
				t.Fatalf("the refused rotation appended %d records", n-seq)
			}
			_, err = s.RotateJWTKey(ctx, again, link(record("jwt.rotate")))
			mustNil(t, "a rotation from the read after the restore", err)
		}},
		{"a certificate revocation list signed from a read before the restore is refused", func(t *testing.T, ctx context.Context, ss SnapshotStore) {
			s := ss.Store
			list := func(n int64, this time.Duration, der string) store.CRL {
				return store.CRL{Issuer: "agent-0a", Number: n, ThisUpdate: at(this), NextUpdate: at(this + time.Hour), Digest: []byte(der), DER: []byte(der)}
			}
			backup := list(100, 0, "backup")
			mustNil(t, "PutCRL", s.PutCRL(ctx, backup, store.CRL{}))
			restore := ss.Snapshot(t, "crls")
			// Numbers run ahead of the signing second in a burst of lists:
			// the restored store's next list may take one of them again.
			mustNil(t, "PutCRL before the restore", s.PutCRL(ctx, list(101, time.Minute, "lost"), backup))
			stale, err := s.GetCRL(ctx, "agent-0a")
			mustNil(t, "GetCRL", err)
			restore(t)
			again := list(101, 2*time.Minute, "after")
			mustNil(t, "PutCRL after the restore", s.PutCRL(ctx, again, backup))
			wantErr(t, "a list signed from the read before the restore", s.PutCRL(ctx, list(102, 3*time.Minute, "late"), stale), store.ErrConflict)
			got, err := s.GetCRL(ctx, "agent-0a")
			mustNil(t, "GetCRL", err)
			wantEqual(t, "the list after the refused write", got, again)
			mustNil(t, "a list signed from the read after the restore", s.PutCRL(ctx, list(102, 3*time.Minute, "next"), got))
		}},
		{"a setting written from a read before the restore is refused", func(t *testing.T, ctx context.Context, ss SnapshotStore) {
			s := ss.Store
			const key = "signer.min_lead_time"
			put := func(value string, from store.Setting) (store.Setting, error) {
				return s.PutSetting(ctx, store.Setting{Key: key, Value: value, UpdatedBy: "admin:ops"}, from, link(record("setting.set")))
			}
			backup, err := put("10m0s", store.Setting{})
			mustNil(t, "PutSetting", err)
			restore := ss.Snapshot(t, "settings")
			stale, err := put("1m0s", backup)
			mustNil(t, "PutSetting before the restore", err)
			restore(t)
			afterStoreClock(t, ctx, s, stale.UpdatedAt)
			again, err := put("2m0s", backup)
			mustNil(t, "PutSetting after the restore", err)
			if again.Version != stale.Version || again.UpdatedAt.Equal(stale.UpdatedAt) {
				t.Fatalf("written back up to %+v; the read before the restore %+v; want the same version at another time", again, stale)
			}
			seq := auditSeq(t, ctx, s)
			// Its record would say 1m0s was replaced, where 2m0s is.
			_, err = put("3m0s", stale)
			wantErr(t, "a write from the read before the restore", err, store.ErrConflict)
			got, err := s.ListSettings(ctx)
			mustNil(t, "ListSettings", err)
			wantEqual(t, "the settings after the refused write", got, []store.Setting{again})
			if n := auditSeq(t, ctx, s); n != seq {
				t.Fatalf("the refused write appended %d records", n-seq)
			}
			_, err = put("3m0s", again)
			mustNil(t, "a write from the read after the restore", err)
		}},
	}
}
