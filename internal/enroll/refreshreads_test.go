package enroll

import (
	"context"
	"crypto/ed25519"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/store"
)

// countingStore counts the reads a join makes.
type countingStore struct {
	Store
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingStore) count(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[name]++
}

func (c *countingStore) GetInstance(ctx context.Context, id string) (store.Instance, error) {
	c.count("GetInstance")
	return c.Store.GetInstance(ctx, id)
}

func (c *countingStore) GetNode(ctx context.Context, id string) (store.Node, error) {
	c.count("GetNode")
	return c.Store.GetNode(ctx, id)
}

func (c *countingStore) FindAnyLock(ctx context.Context, targets []store.LockTarget) (store.Lock, error) {
	c.count("FindAnyLock")
	return c.Store.FindAnyLock(ctx, targets)
}

func (c *countingStore) ReadRenewal(ctx context.Context, serial string, keys []string) (store.RenewalRead, error) {
	c.count("ReadRenewal")
	return c.Store.ReadRenewal(ctx, serial, keys)
}

func (c *countingStore) ListResyncEpochs(ctx context.Context) ([]store.ResyncEpoch, error) {
	c.count("ListResyncEpochs")
	return c.Store.ListResyncEpochs(ctx)
}

// TestBoundKeypairRefreshReadsOnce: a refresh reads the certificate record,
// the instance, the node and every lock (the join's and the renewal's) in
// one read, ReadRenewal (one round trip on PostgreSQL; four reads before);
// a lock only the renewal used to check (on the instance) still refuses
// it, and so does one only the join checks (on the bound key).
func TestBoundKeypairRefreshReadsOnce(t *testing.T) {
	b := newBKEnv(t, 1, boundkeypair.ModeStandard)
	first, _ := b.register(t)
	leaf, err := ca.ParseCertsPEM(first.ChainPEM)
	if err != nil {
		t.Fatal(err)
	}
	c := &countingStore{Store: b.svc.cfg.Store, calls: map[string]int{}}
	b.svc.cfg.Store = c
	refresh := func() (*BoundKeypairResult, error) {
		_, der := csr(t)
		return b.svc.RegisterUsingBoundKeypair(t.Context(), Request{}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
			CSR: der, JoinState: first.JoinState, Cert: leaf[0]}, answerWith(b.priv))
	}
	res, err := refresh()
	if err != nil || res.InstanceID != first.InstanceID {
		t.Fatalf("refresh: %+v, %v", res, err)
	}
	// GetCertificate is no longer in enroll's Store at all: its 0 holds by
	// the type.
	want := map[string]int{"ReadRenewal": 1, "GetCertificate": 0, "GetInstance": 0, "GetNode": 0, "FindAnyLock": 0}
	for name, n := range want {
		if c.calls[name] != n {
			t.Errorf("%s called %d times in a refresh, want %d (all: %v)", name, c.calls[name], n, c.calls)
		}
	}
	if c.calls["ListResyncEpochs"] != 0 {
		t.Errorf("a refresh with the current join state read the resync epochs: %v", c.calls)
	}

	if err := b.st.InsertLock(t.Context(), store.Lock{ID: "lock-i", Kind: store.LockInstance, Target: first.InstanceID,
		CreatedBy: "admin", CreatedAt: b.svc.cfg.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	_, err = refresh()
	wantRefusal(t, err, KindPermissionDenied, ReasonLocked)
	if err := b.st.DeleteLock(t.Context(), "lock-i", setupLink); err != nil {
		t.Fatal(err)
	}
	bound, err := boundkeypair.NewPublicKey(b.priv.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.st.InsertLock(t.Context(), store.Lock{ID: "lock-k", Kind: store.LockPublicKey, Target: bound.Fingerprint(),
		CreatedBy: "admin", CreatedAt: b.svc.cfg.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	_, err = refresh()
	wantRefusal(t, err, KindPermissionDenied, ReasonLocked)
}

// TestBoundKeypairDeclinedRebindReadsEpochsOnce: a join that offers a key
// other than the bound one, inside a window that does not rebind it (its
// document names yet another key), is challenged with the bound
// key and judged with the epochs rebindable already read: one read of
// them, not two.
func TestBoundKeypairDeclinedRebindReadsEpochsOnce(t *testing.T) {
	b := newBKEnv(t, 5, boundkeypair.ModeStandard)
	b.register(t)
	b.openWindow(t, "ep-1")
	c := &countingStore{Store: b.svc.cfg.Store, calls: map[string]int{}}
	b.svc.cfg.Store = c
	_, key := newKey(t)
	_, named := newKey(t)
	_, der := csr(t)
	_, err := b.svc.RegisterUsingBoundKeypair(t.Context(), Request{Source: "test"}, BoundKeypairPayload{Token: "bot-1", NodeID: "node-1",
		CSR: der, JoinState: b.signedFor(t, named, 1, time.Now().Add(time.Second)), PublicKey: key.String()}, answerWith(b.priv))
	// The bound key answered, with a document at the token's sequence:
	// a recovery, which records the current epoch.
	if err != nil {
		t.Fatalf("the recovery with the bound key: %v", err)
	}
	if n := c.calls["ListResyncEpochs"]; n != 1 {
		t.Errorf("ListResyncEpochs called %d times, want 1 (all: %v)", n, c.calls)
	}
}
