package authority

import (
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store/sqlite"
)

// TestCAClockSteadyTickParsesAndVerifiesNothing: a tick of the leader's
// CA clock that finds the rows the tick before found parses no
// certificate and verifies no signature (the active intermediates by the
// signing root, rootSteps); a new row (a prepared successor) is parsed
// and its signature verified once, when it first appears.
func TestCAClockSteadyTickParsesAndVerifiesNothing(t *testing.T) {
	a := startReplicas(t, nil, 1, func(c *Config) {
		c.CAIntermediateTTL = 3 * time.Minute
		// The test is the only caller of caStepAt, as the leader's clock
		// is in production: the replica's own clock would tick between
		// the test's steps and share (and sweep) the cache.
		c.Store = followerStore{c.Store.(*sqlite.SQLite)}
	})
	ctx := t.Context()
	s := a.srvs[0]
	now := time.Now()
	storeIntermediate(t, ctx, a, now.Add(-10*time.Second), 3*time.Minute) // far from half-life
	verified := 0                                                         // signatures verified by the last step
	step := func(at time.Time) int {
		t.Helper()
		before, checks := s.caCerts.parsed(), s.caCerts.verified()
		if err := s.caStepAt(ctx, at); err != nil {
			t.Fatal(err)
		}
		verified = s.caCerts.verified() - checks
		return s.caCerts.parsed() - before
	}
	if n := step(now); n == 0 || verified == 0 {
		t.Fatalf("the first tick parsed %d certificates and verified %d signatures; the test counts nothing", n, verified)
	}
	for i := range 3 {
		if n := step(now.Add(time.Duration(i) * caTick)); n != 0 || verified != 0 {
			t.Fatalf("steady tick %d parsed %d certificates and verified %d signatures, want none", i, n, verified)
		}
	}
	// Past half-life the tick prepares a successor; the tick after parses
	// it (prepared rows of a root rotation are checked), once.
	step(now.Add(100 * time.Second))
	step(now.Add(100*time.Second + caTick))
	if n := step(now.Add(100*time.Second + 2*caTick)); n != 0 || verified != 0 {
		t.Fatalf("the tick after a prepare settled parsed %d certificates and verified %d signatures, want none", n, verified)
	}
}
