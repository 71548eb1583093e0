package enroll

import (
	"errors"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// TestLockedUntilIsTheLastLocksEnd: a request refused for a lock is told
// to retry when the last lock that applies ends, not when the one named
// first (node, then instance, token, key) does: told that, the agent
// would retry and be refused again. A lock without end makes it "no end".
func TestLockedUntilIsTheLastLocksEnd(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token(t, 2)
	_, der := csr(t)
	joined, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
	if err != nil {
		t.Fatal(err)
	}
	chain, _ := ca.ParseCertsPEM(joined.ChainPEM)
	now := time.Now().UTC().Truncate(time.Microsecond)
	lock := func(id, kind, target string, ttl time.Duration) {
		t.Helper()
		l := store.Lock{ID: id, Kind: kind, Target: target, CreatedAt: now}
		if ttl > 0 {
			l.ExpiresAt = now.Add(ttl)
		}
		if err := e.st.InsertLock(t.Context(), l, setupLink); err != nil {
			t.Fatal(err)
		}
	}
	until := func(what string, err error) time.Time {
		t.Helper()
		var ref *Refusal
		if !errors.As(err, &ref) || ref.Reason != ReasonLocked {
			t.Fatalf("%s: %v, want refused %q", what, err, ReasonLocked)
		}
		return ref.Until
	}
	// The node's lock, named first, ends in an hour; the instance's and
	// the token's later.
	lock("l-node", store.LockNode, "n1", time.Hour)
	lock("l-inst", store.LockInstance, joined.InstanceID, 3*time.Hour)
	lock("l-tok", store.LockToken, tok.ID, 2*time.Hour)
	want := now.Add(3 * time.Hour)
	_, renewCSR := csr(t)
	if got := until("renewal", func() error { _, err := e.svc.Renew(t.Context(), Request{}, chain[0], renewCSR); return err }()); !got.Equal(want) {
		t.Errorf("renewal refused until %v, want %v (the instance's lock's end, the latest)", got, want)
	}
	if got := until("standing", e.svc.Standing(t.Context(), chain[0])); !got.Equal(want) {
		t.Errorf("standing refused until %v, want %v", got, want)
	}
	// A join as another node with the locked token: the token's lock
	// (an hour's end on the new node is named first) ends last.
	lock("l-node2", store.LockNode, "n2", time.Hour)
	_, der2 := csr(t)
	_, err = e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n2", der2)
	if got, want := until("join", err), now.Add(2*time.Hour); !got.Equal(want) {
		t.Errorf("join refused until %v, want %v (the token's lock's end)", got, want)
	}
	// A lock without end on one target: the refusal has none either.
	lock("l-inst-forever", store.LockInstance, joined.InstanceID, 0)
	if got := until("renewal", func() error { _, err := e.svc.Renew(t.Context(), Request{}, chain[0], renewCSR); return err }()); !got.IsZero() {
		t.Errorf("renewal refused until %v, want no end (a lock without TTL applies)", got)
	}
}
