package authority

import (
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestCAClockWakesAtPublishWindowEnd: the leader's CA clock takes the step
// a publish window waits for when the window ends, not at its next tick.
// The tick here is an hour, so the root rotation's step to update_servers
// (the phase change pokes the clock, which prepares intermediates under
// the new root; they are activated once published) finds every active
// intermediate under the new root when it answers only if the clock woke
// at the window's end; with the tick alone it waits out
// awaitIntermediatesUnder's 30 s and answers with them still under the old.
func TestCAClockWakesAtPublishWindowEnd(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, func(c *Config) {
		c.CATick = time.Hour
		c.CAPublishWindow = 300 * time.Millisecond
	})
	s := a.srvs[0]
	ctx := t.Context()
	st, err := s.rotateRoot(ctx, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	for st.Phase != store.RootPhaseUpdateServers {
		if _, st, err = s.stepRoot(ctx, "test", rootNext); err != nil {
			t.Fatalf("step from %s: %v", st.Phase, err)
		}
	}
	n, err := s.intermediatesNotUnder(ctx, st.New)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("update_servers answered with %d active intermediates not under the new root: the clock waited for its tick", n)
	}
}
