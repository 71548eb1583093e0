package enroll

import (
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// standingOf runs on every renewal and stream standing check: an instance
// in standing costs no allocation, the way out is made only on a refusal.
func TestStandingOfAllocatesOnlyOnARefusal(t *testing.T) {
	rec := store.Certificate{NodeID: "n1", InstanceID: "i1"}
	node := store.Node{InstanceID: "i1"}
	for _, method := range []string{store.JoinMethodBoundKeypair, store.JoinMethodToken} {
		inst := store.Instance{ID: "i1", NodeID: "n1", JoinMethod: method, TokenID: "t1"}
		if err := standingOf(rec, inst, node, true); err != nil {
			t.Fatalf("%s: standing instance refused: %v", method, err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = standingOf(rec, inst, node, true) }); n != 0 {
			t.Errorf("%s: standingOf allocates %v times for an instance in standing, want 0", method, n)
		}
	}
}
