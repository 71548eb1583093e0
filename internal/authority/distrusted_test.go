package authority

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// TestDistrustedCallerUsesTheServersClock: whether an open agent stream's
// certificate still verifies is judged by the replica's clock
// (Config.Clock), the one its trust bundle is made by, not by time.Now:
// a leaf expired by that clock is left to its stream's deadline, one
// valid by it is refused when no trusted root signed it. Before, a
// foreign leaf was refused by time.Now although the server's clock had it
// expired.
func TestDistrustedCallerUsesTheServersClock(t *testing.T) {
	f := newLeafAloneFixture(t)
	now := time.Now()
	own := f.identity(t, f.h, ca.RoleAgent, now).Chain[0]
	foreign := f.identity(t, f.other, ca.RoleAgent, now).Chain[0]
	for _, c := range []struct {
		name    string
		leaf    *x509.Certificate
		at      time.Time
		refused bool
	}{
		{"own, valid", own, now.Add(30 * time.Minute), false},
		{"own, expired by the clock", own, now.Add(2 * time.Hour), false},
		{"foreign, valid", foreign, now.Add(30 * time.Minute), true},
		{"foreign, expired by the clock", foreign, now.Add(2 * time.Hour), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.srv.cfg.Clock = func() time.Time { return c.at }
			why := f.srv.distrustedCaller(c.leaf)
			if got := why != ""; got != c.refused {
				t.Errorf("at %s: refusal %q, want refused %v", c.at.Sub(now), why, c.refused)
			}
		})
	}
}
