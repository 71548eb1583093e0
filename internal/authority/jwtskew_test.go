package authority

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// skewedStore is a store whose clock (its Now, and the rotation times it
// writes) is skew ahead of this process's: a database server's clock
// apart from the replica's.
type skewedStore struct {
	store.Store
	skew time.Duration
}

func (s skewedStore) Now(ctx context.Context) (time.Time, error) {
	now, err := s.Store.Now(ctx)
	return now.Add(s.skew), err
}

func (s skewedStore) GetJWTKey(ctx context.Context) (store.JWTKey, error) {
	k, err := s.Store.GetJWTKey(ctx)
	k.RotatedAt = k.RotatedAt.Add(s.skew)
	return k, err
}

func (s skewedStore) RotateJWTKey(ctx context.Context, from store.JWTKey, audit func(store.AuditHead) (store.AuditRecord, error)) (store.JWTKey, error) {
	from.RotatedAt = from.RotatedAt.Add(-s.skew) // as the store wrote it
	k, err := s.Store.RotateJWTKey(ctx, from, audit)
	k.RotatedAt = k.RotatedAt.Add(s.skew)
	return k, err
}

// TestPublishedForFollowsTheStoresClock: the time each key stays
// published (GetJWTBundle's published_for) is counted on the store's
// clock, the one its rotation time was written by and the one that
// rotates it, so a replica whose clock is minutes off the store's tells
// agents the same times as one in step. Before, it was the rotation time
// less this replica's clock: a replica 10 minutes behind the store said
// 10 minutes more (an agent cut off trusted a retired key that much
// longer), one ahead 10 minutes less (it stopped that much early).
func TestPublishedForFollowsTheStoresClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openSQLite(t)
	for _, skew := range []time.Duration{-10 * time.Minute, 0, 10 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			st := skewedStore{Store: db, skew: skew}
			s := &Server{store: st, cfg: Config{StorageKey: seal.StorageKey{7}, JWTKeyRotationPeriod: time.Hour}, log: slog.New(slog.DiscardHandler)}
			if err := s.loadJWTKey(); err != nil {
				t.Fatal(err)
			}
			period := s.jwtKeyPeriod()
			// Rotated if due, so the rotation time is recent.
			if err := s.jwtKeyStepWith(ctx, period); err != nil {
				t.Fatal(err)
			}
			k, err := st.GetJWTKey(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before, _ := st.Now(ctx)
			pf := s.publishedFor(s.jwt.Load())
			after, _ := st.Now(ctx)
			versions := s.jwt.Load().KeyVersions()
			if len(pf) != len(versions) {
				t.Fatalf("published_for %v, want one per key of %v", pf, versions)
			}
			for kid, v := range versions {
				leaves := k.RotatedAt.Add(time.Duration(v+2-k.Version) * period)
				// By the store's clock, between the two reads of it (a
				// second's margin for the reading kept, and SQLite's
				// clock to the millisecond).
				lo, hi := leaves.Sub(after)-time.Second, leaves.Sub(before)+time.Millisecond
				if d := pf[kid]; d < lo || d > hi {
					t.Errorf("version %d (current %d) published for %s, want between %s and %s (it leaves at %s by the store's clock)", v, k.Version, d, lo, hi, leaves)
				}
			}
		})
	}
}
