package authority

import (
	"crypto/x509"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/spiffeid"
)

// TestLiveStreamsFlapsForgotten: a node's replacement record (flaps) is
// forgotten once older than flapWindow, even when its stream ended while
// the record was young (a renewal's reconnection, then the node deleted)
// and the node never streams again. Before, such records stayed for the
// replica's life: one per node that ever reconnected under a new
// certificate or address, without bound.
func TestLiveStreamsFlapsForgotten(t *testing.T) {
	var l liveStreams
	stream := func(node, source string, serial int64) *agentStream {
		return &agentStream{c: Caller{ID: spiffeid.ID{Role: spiffeid.RoleAgent, Name: node}, Source: source,
			Cert: &x509.Certificate{SerialNumber: big.NewInt(serial)}}}
	}
	t0 := time.Now()
	for i := range 100 {
		node := fmt.Sprintf("n%d", i)
		l.take(stream(node, "10.0.0.1:1", 1), t0)
		renewed := stream(node, "10.0.0.1:2", 2)
		l.take(renewed, t0)
		l.drop(renewed) // the node goes away within flapWindow
	}
	if len(l.flaps) == 0 {
		t.Fatal("no replacement recorded: the test does not exercise flaps")
	}
	later := t0.Add(flapWindow + time.Minute)
	l.take(stream("other", "10.0.0.1:1", 1), later)
	l.take(stream("other", "10.0.0.2:1", 1), later)
	if len(l.flaps) != 1 {
		t.Fatalf("%d replacement records kept after flapWindow, want 1 (the live node's)", len(l.flaps))
	}
	// A copy's alternations are still counted.
	_, n := l.take(stream("other", "10.0.0.1:1", 1), later.Add(time.Second))
	if n != 1 {
		t.Fatalf("alternations %d, want 1", n)
	}
}
