package authority

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestAbandonWaitsForAgentsUnderTheNewRoot: rolled back from
// update_servers to init, abandoning the new root is refused while an
// agent certificate issued under it in update_servers may still be valid
// (its agent could not renew, and no rollback would bring it back): the
// refusal says until when, and names --abandon-now; it writes nothing.
// Once one agent certificate lifetime has passed, the rollback abandons;
// with --abandon-now (rootBackNow) it abandons at once. The wait is
// counted on the store's clock, which wrote the retiring times: a replica
// whose own clock is hours ahead of the store's still refuses, and one
// hours behind abandons once the store's clock has passed the wait.
// Before, a replica ahead abandoned at once and one behind refused hours
// longer.
func TestAbandonWaitsForAgentsUnderTheNewRoot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		now  bool
		skew time.Duration // the replica's clock, ahead of the store's
	}{{false, 0}, {false, 3 * time.Hour}, {false, -3 * time.Hour}, {true, 0}} {
		var ahead atomic.Int64 // the store's clock, ahead of real time
		a := startReplicas(t, nil, 1, fastCAClock, func(c *Config) {
			c.AgentCertTTL = time.Hour
			c.Store = movedStore{Store: c.Store, ahead: &ahead}
			c.Clock = func() time.Time { return time.Now().Add(time.Duration(ahead.Load()) + tc.skew) }
		})
		now := tc.now
		s := a.srvs[0]
		ctx := t.Context()
		if _, err := s.rotateRoot(ctx, "t", nil); err != nil {
			t.Fatal(err)
		}
		for _, step := range []rootStep{rootNext, rootNext, rootBack, rootBack} {
			if _, _, err := s.stepRoot(ctx, "t", step); err != nil {
				t.Fatal(err)
			}
		}
		before, err := s.rootStatus(ctx)
		if err != nil || before.Phase != store.RootPhaseInit {
			t.Fatalf("rolled back to %q (%v), want init", before.Phase, err)
		}
		if now {
			if _, st, err := s.stepRoot(ctx, "t", rootBackNow); err != nil || st.Phase != store.RootPhaseNone {
				t.Fatalf("abandon now: phase %q, %v; want none", st.Phase, err)
			}
			continue
		}
		_, _, err = s.stepRoot(ctx, "t", rootBack)
		if !errors.As(err, new(rootRule)) || !strings.Contains(err.Error(), "muster ca root rollback --abandon-now") ||
			!strings.Contains(err.Error(), "run muster ca root rollback again after") {
			t.Fatalf("replica clock %s off the store's: abandoning with agent certificates under the new root maybe valid: %v; want a refusal naming the wait and --abandon-now", tc.skew, err)
		}
		if after, _ := s.rootStatus(ctx); after.Version != before.Version || after.Phase != store.RootPhaseInit {
			t.Fatalf("the refused abandon wrote the rotation: version %d → %d, phase %q", before.Version, after.Version, after.Phase)
		}
		ahead.Store(int64(time.Hour + 2*retireMargin))
		if _, st, err := s.stepRoot(ctx, "t", rootBack); err != nil || st.Phase != store.RootPhaseNone {
			t.Fatalf("replica clock %s off the store's: abandon one agent certificate lifetime later: phase %q, %v; want none", tc.skew, st.Phase, err)
		}
	}
}

// movedStore is a store whose clock is ahead of real time by ahead: the
// time that passed since what it holds was written.
type movedStore struct {
	store.Store
	ahead *atomic.Int64
}

func (s movedStore) Now(ctx context.Context) (time.Time, error) {
	now, err := s.Store.Now(ctx)
	return now.Add(time.Duration(s.ahead.Load())), err
}
