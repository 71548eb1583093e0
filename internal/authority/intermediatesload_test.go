package authority

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// heldListStore holds one ListCACerts answer back, once armed: the call
// reads the rows, says so on read, and returns them only once release is
// closed, as a slow store round trip would.
type heldListStore struct {
	*sqlite.SQLite
	armed   atomic.Pointer[chan struct{}]
	read    chan struct{}
	release chan struct{}
}

func (h *heldListStore) ListCACerts(ctx context.Context) ([]store.CACert, error) {
	rows, err := h.SQLite.ListCACerts(ctx)
	if h.armed.Swap(nil) != nil {
		h.read <- struct{}{}
		<-h.release
	}
	return rows, err
}

// RunAsLeader never leads: the CA clock reads no rows here.
func (h *heldListStore) RunAsLeader(ctx context.Context, _ string, _ func(context.Context) error) error {
	<-ctx.Done()
	return nil
}

// TestSlowReadOfIntermediatesIsNotInstalledLast: two reads of the
// intermediates at once (the change watch's and an operator's step, say),
// the first slow: the rows it read before an activation must not be
// installed after the second read's, which would take the replica back to
// signing with the intermediate just replaced (found by
// TestCALifecycleModel: the CA clock retired it meanwhile, and the
// renewal of an agent whose certificate that replica had signed with it
// was refused).
func TestSlowReadOfIntermediatesIsNotInstalledLast(t *testing.T) {
	var h *heldListStore
	a := startReplicas(t, nil, 1, func(c *Config) {
		h = &heldListStore{SQLite: c.Store.(*sqlite.SQLite), read: make(chan struct{}, 1), release: make(chan struct{})}
		c.Store = h
	})
	s := a.srvs[0]
	ctx := t.Context()
	rs := s.ca.Roots()
	p, err := s.inter.prepareUnder(ctx, ca.RoleAgent, rs.Signing, rs.SigningKey, time.Hour, s.testPrepareLink)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}

	var armed chan struct{}
	h.armed.Store(&armed)
	slow := make(chan error, 1)
	go func() { slow <- s.inter.load(ctx) }()
	<-h.read // it read the rows with p prepared
	if err := a.store.ActivateCACert(ctx, string(ca.RoleAgent), p.Serial, setupLink); err != nil {
		t.Fatal(err)
	}
	fast := make(chan error, 1)
	go func() { fast <- s.inter.load(ctx) }()
	select {
	case err := <-fast: // it did not wait for the slow read
		if err != nil {
			t.Fatal(err)
		}
		fast <- nil
	case <-time.After(time.Second):
	}
	close(h.release)
	for _, c := range []chan error{slow, fast} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if got := s.ca.Issuer(ca.RoleAgent).Cert.SerialNumber.Text(16); got != p.Serial {
		t.Fatalf("after both reads the replica signs agents with intermediate %s, not %s, activated before the second read", got, p.Serial)
	}
}
