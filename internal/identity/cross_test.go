package identity

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// TestCrossCertified: a root the peer presents is accepted only through a
// cross-certificate, also presented, that verifies under a root already
// trusted and is valid now; a self-made one or an expired one adds
// nothing, so a presented chain cannot widen a pin by itself.
func TestCrossCertified(t *testing.T) {
	now := time.Now()
	pinned, err := ca.Create("pinned", now)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Create("other", now)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(pinned.Root)
	good, err := ca.CrossSign(other.Root, pinned.Root, pinned.RootKey, now)
	if err != nil {
		t.Fatal(err)
	}
	selfMade, err := ca.CrossSign(other.Root, other.Root, other.RootKey, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		presented []*x509.Certificate
		at        time.Time
		want      int
	}{
		{"the root alone", []*x509.Certificate{other.Root}, now, 0},
		{"a cross-certificate by the root's own key", []*x509.Certificate{selfMade, other.Root}, now, 0},
		{"a cross-certificate under the pinned root", []*x509.Certificate{good, other.Root}, now, 1},
		{"the same, after the cross-certificate expired", []*x509.Certificate{good, other.Root}, good.NotAfter.Add(time.Hour), 0},
		{"the cross-certificate without the root", []*x509.Certificate{good}, now, 0},
	} {
		if got := CrossCertified(c.presented, pool, c.at); len(got) != c.want {
			t.Errorf("%s: %d roots accepted, want %d", c.name, len(got), c.want)
		}
	}
}
