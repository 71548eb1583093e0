package authority

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

func aheadValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

type auditEvents struct {
	mu     sync.Mutex
	events []audit.Event
}

func (a *auditEvents) Record(_ context.Context, e audit.Event) (store.AuditRecord, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, e)
	return store.AuditRecord{}, nil
}

// Builder builds e's record as the next link of the store's chain (a
// change's, written with it); Appended logs e once that write committed.
func (a *auditEvents) Builder(e audit.Event) (*audit.Link, error) { return testLink(e), nil }

func (a *auditEvents) Appended(link *audit.Link) { a.Record(context.Background(), link.Event()) }

// testLink builds e's record as the next link of a store's chain, outside
// any chain key: tests using it do not verify the chain.
func testLink(e audit.Event) *audit.Link {
	return audit.NewLink(e, func(h store.AuditHead) (store.AuditRecord, error) {
		r, err := setupLink(h)
		r.Actor, r.Action, r.Target, r.Result, r.Reason = e.Actor, e.Action, e.Target, e.Result, e.Reason
		return r, err
	})
}

// signedSet is k's signers as a set of version v, signed by the active
// signer: what an agent holding version v of this authority's sets holds.
func signedSet(t *testing.T, k *signer.Keeper, v int64) []byte {
	t.Helper()
	snap, err := k.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	id, sign, err := k.ActiveSigner(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := signer.NewVerifierSet("prod-a3f2e1", v, snap.Signers, snap.Now, 0).Sign(id, sign)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestHeartbeatAheadOfTheStore: heartbeats carrying a verifier set above
// the store's version (a restored store) are logged once per version,
// counted, audited, and move the store's version past them, at most once
// a minute per replica; a set this store's keys did not sign moves
// nothing.
func TestHeartbeatAheadOfTheStore(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	custody, _ := signer.NewSealed(seal.StorageKey{5})
	events := &auditEvents{}
	k := signer.NewKeeper(st, custody, events, "prod-a3f2e1", 0)
	if _, err := k.EnsureFirst(ctx, signer.Actor{Name: "authority"}); err != nil {
		t.Fatal(err)
	}
	ahead, err := newSetAhead(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s := &Server{signers: k, setAhead: ahead, log: slog.New(slog.NewTextHandler(&logs, nil))}

	// Another authority's signers, same IDs: a set they signed is not this store's.
	other, _ := signer.NewSealed(seal.StorageKey{6})
	st2, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "other.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st2.Close() })
	k2 := signer.NewKeeper(st2, other, &auditEvents{}, "prod-a3f2e1", 0)
	if _, err := k2.EnsureFirst(ctx, signer.Actor{Name: "authority"}); err != nil {
		t.Fatal(err)
	}
	s.checkSetVersion(ctx, "n0", 900, signedSet(t, k2, 900))
	if v, _ := k.SetVersion(ctx); v != 1 {
		t.Fatalf("a set signed by a key this store does not hold moved it to %d", v)
	}
	if last := events.events[len(events.events)-1]; last.Action != "node_task_signer.advance" || last.Result != audit.ResultDenied {
		t.Fatalf("the made-up set's refusal audited as %+v", last)
	}
	// Made-up sets again within the minute: not audited again.
	audited := len(events.events)
	s.checkSetVersion(ctx, "n0", 900, signedSet(t, k2, 900))
	if len(events.events) != audited || aheadValue(t, ahead.limited) != 1 {
		t.Fatalf("a second refusal within the minute audited (%d records, was %d) or not counted", len(events.events), audited)
	}

	s.checkSetVersion(ctx, "n1", 1, signedSet(t, k, 1)) // what the store holds: nothing to do
	if v, _ := k.SetVersion(ctx); v != 1 || aheadValue(t, ahead.detected) != 2 {
		t.Fatalf("a heartbeat at the store's version moved it to %d", v)
	}
	// A genuine set right after the made-up ones is followed at once: they
	// did not take its slot.
	s.checkSetVersion(ctx, "n1", 7, signedSet(t, k, 7))
	s.checkSetVersion(ctx, "n2", 7, signedSet(t, k, 7)) // another agent, the version already moved
	if v, _ := k.SetVersion(ctx); v != 8 {
		t.Fatalf("store version %d after heartbeats at 7 (a made-up set just before), want 8", v)
	}
	if n := strings.Count(logs.String(), "newer than the store's"); n != 1 {
		t.Fatalf("logged %d times, want once (for 900, the highest):\n%s", n, logs.String())
	}
	raw, err := k.VerifierSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set, err := signer.ParseVerifierSet(raw); err != nil || set.Version != 8 {
		t.Fatalf("published set %+v: %v", set, err)
	}
	last := events.events[len(events.events)-1]
	if last.Action != "node_task_signer.advance" || last.Result != audit.ResultOK {
		t.Fatalf("audit %+v", last)
	}
	// Within the minute: a genuine set further ahead is counted, not followed.
	s.checkSetVersion(ctx, "n3", 20, signedSet(t, k, 20))
	if v, _ := k.SetVersion(ctx); v != 8 || aheadValue(t, ahead.limited) != 2 {
		t.Fatalf("second advance within a minute: store at %d, limited %v", v, aheadValue(t, ahead.limited))
	}
	ahead.advance.last.Store(time.Now().Add(-advanceEvery).UnixNano())
	s.checkSetVersion(ctx, "n3", 20, signedSet(t, k, 20))
	if v, _ := k.SetVersion(ctx); v != 21 {
		t.Fatalf("a minute later: store at %d, want 21", v)
	}
}

// countingStore counts reads of the store's verifier set version.
type countingStore struct {
	store.Store
	reads atomic.Int64
}

func (c *countingStore) SignerSetID(ctx context.Context) (store.SignerSetID, error) {
	c.reads.Add(1)
	return c.Store.SignerSetID(ctx)
}

// TestHeartbeatSetVersionCached: a heartbeat at or below the store's
// verifier set version costs no store read (before, each one parsed its
// set and read the store's version): the version is read once and kept
// until a signer change is announced; a heartbeat above it is checked
// against the store.
func TestHeartbeatSetVersionCached(t *testing.T) {
	ctx := t.Context()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := &countingStore{Store: db}
	custody, _ := signer.NewSealed(seal.StorageKey{5})
	k := signer.NewKeeper(st, custody, &auditEvents{}, "prod-a3f2e1", 0)
	if _, err := k.EnsureFirst(ctx, signer.Actor{Name: "authority"}); err != nil {
		t.Fatal(err)
	}
	ahead, err := newSetAhead(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{signers: k, setAhead: ahead, hub: newStreamHub(), log: slog.New(slog.DiscardHandler)}
	current := signedSet(t, k, 1)
	reads := func() int64 { return st.reads.Swap(0) }
	reads()
	for range 100 {
		s.checkSetVersion(ctx, "n1", 1, current)
	}
	if n := reads(); n != 1 {
		t.Fatalf("100 heartbeats at the store's version read it %d times, want 1", n)
	}
	// A signer change: the next heartbeat reads the version again, once.
	s.onChange(store.Change{Kind: store.ChangeSigners})
	for range 10 {
		s.checkSetVersion(ctx, "n1", 1, current)
	}
	if n := reads(); n != 1 {
		t.Fatalf("after a signer change, 10 heartbeats read the version %d times, want 1", n)
	}
	// Other changes keep it.
	s.onChange(store.Change{Kind: store.ChangeTasks | store.ChangeStanding | store.ChangeStream, Nodes: []string{"n1"}})
	s.checkSetVersion(ctx, "n1", 1, current)
	if n := reads(); n != 0 {
		t.Fatalf("a change of tasks or standing made a heartbeat read the version %d times", n)
	}
	// A heartbeat above the cached version is checked against the store,
	// and followed.
	s.checkSetVersion(ctx, "n1", 5, signedSet(t, k, 5))
	if v, _ := k.SetVersion(ctx); v != 6 {
		t.Fatalf("store version %d after a heartbeat at 5, want 6", v)
	}
}

// TestHeartbeatAfterAnOfflineSignerChange: a signer change made with no
// replica to announce it (a step run offline against the store, as muster
// ca migrate-custody and signer stage without a running authority do)
// leaves the replica's cached version stale; an agent that took the new
// set is not ahead of the store, so nothing is logged or counted as ahead.
func TestHeartbeatAfterAnOfflineSignerChange(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "muster.db")
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	custody, _ := signer.NewSealed(seal.StorageKey{5})
	k := signer.NewKeeper(db, custody, &auditEvents{}, "prod-a3f2e1", 0)
	if _, err := k.EnsureFirst(ctx, signer.Actor{Name: "authority"}); err != nil {
		t.Fatal(err)
	}
	ahead, err := newSetAhead(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s := &Server{signers: k, setAhead: ahead, hub: newStreamHub(), log: slog.New(slog.NewTextHandler(&logs, nil))}
	s.checkSetVersion(ctx, "n1", 1, signedSet(t, k, 1)) // the replica caches version 1

	// Offline: another process over the same database stages a signer.
	offDB, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { offDB.Close() })
	off := signer.NewKeeper(offDB, custody, &auditEvents{}, "prod-a3f2e1", 0)
	if _, err := off.Stage(ctx, signer.Actor{Name: "operator"}, time.Hour, time.Hour); err != nil {
		t.Fatal(err)
	}
	v, err := off.SetVersion(ctx)
	if err != nil || v < 2 {
		t.Fatalf("the offline stage left the version at %d: %v", v, err)
	}
	raw, err := off.VerifierSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.checkSetVersion(ctx, "n1", v, raw)
	if strings.Contains(logs.String(), "newer than the store's") || aheadValue(t, ahead.detected) != 0 || aheadValue(t, ahead.highest) != 0 {
		t.Fatalf("a set at the store's version %d called ahead of it (detected %v, highest %v):\n%s", v,
			aheadValue(t, ahead.detected), aheadValue(t, ahead.highest), logs.String())
	}
	if got, _ := k.SetVersion(ctx); got != v {
		t.Fatalf("store version %d, want %d unchanged", got, v)
	}
	// The cache took the store's version: the next heartbeat at it reads
	// nothing ahead either.
	s.checkSetVersion(ctx, "n2", v, raw)
	if aheadValue(t, ahead.detected) != 0 {
		t.Fatalf("a second heartbeat counted ahead")
	}
}
