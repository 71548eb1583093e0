package signer

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

type auditLog struct {
	mu     sync.Mutex
	events []audit.Event
	// refuse, when set, is what the records of changes fail with: the
	// chain refuses them (those of refuseAction only, when it is set).
	refuse       error
	refuseAction string
}

// Builder builds e's record as the next link of the store's chain; once
// its write committed (Appended), e is logged with the refusals.
func (a *auditLog) Builder(e audit.Event) (*audit.Link, error) {
	a.mu.Lock()
	refuse := a.refuse
	if a.refuseAction != "" && a.refuseAction != e.Action {
		refuse = nil
	}
	a.mu.Unlock()
	return chainLink(e, refuse), nil
}

func (a *auditLog) Appended(link *audit.Link) { a.Record(context.Background(), link.Event()) }

// chainLink builds e's record as the next link of a store's chain, or
// fails with refuse when it is set. Its hash names its place only: the
// keeper's tests verify no chain.
func chainLink(e audit.Event, refuse error) *audit.Link {
	return audit.NewLink(e, func(h store.AuditHead) (store.AuditRecord, error) {
		if refuse != nil {
			return store.AuditRecord{}, refuse
		}
		return store.AuditRecord{Seq: h.Seq + 1, PrevHash: h.Hash, Hash: []byte(strconv.FormatInt(h.Seq+1, 10)), Time: time.Now(),
			Actor: e.Actor, Action: e.Action, Target: e.Target, Result: e.Result, Reason: e.Reason}, nil
	})
}

func (a *auditLog) Record(_ context.Context, e audit.Event) (store.AuditRecord, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, e)
	return store.AuditRecord{}, nil
}

// clockStore moves the store's clock by an offset, so a test can step
// through effective and grace times.
type clockStore struct {
	store.Store
	offset time.Duration
}

func (c *clockStore) Now(ctx context.Context) (time.Time, error) {
	now, err := c.Store.Now(ctx)
	return now.Add(c.offset), err
}

func newKeeper(t *testing.T) (*Keeper, *clockStore, *auditLog) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "muster.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	custody, _ := NewSealed(seal.StorageKey{3})
	cs := &clockStore{Store: st}
	log := &auditLog{}
	return NewKeeper(cs, custody, log, "prod-a3f2e1", 0), cs, log
}

func TestKeeperLifecycle(t *testing.T) {
	ctx := t.Context()
	k, clock, log := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops", CorrelationID: "c-1"}

	// Replicas starting together create one first signer.
	var wg sync.WaitGroup
	created := make([]bool, 4)
	for i := range created {
		wg.Go(func() {
			var err error
			if created[i], err = k.EnsureFirst(ctx, Actor{Name: "authority"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	n := 0
	for _, c := range created {
		if c {
			n++
		}
	}
	snap, _ := k.Load(ctx)
	if n != 1 || len(snap.Signers) != 1 || snap.Signers[0].State != Active {
		t.Fatalf("%d creations, signers %+v", n, snap.Signers)
	}

	if _, err := k.Stage(ctx, who, time.Minute, time.Hour); !IsRule(err) {
		t.Fatalf("stage inside lead time: %v", err)
	}
	res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := k.VerifierSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ParseVerifierSet(raw)
	if err != nil || set.Version != res.Version || len(set.Keys) != 2 {
		t.Fatalf("verifier set %+v, %v", set, err)
	}

	// Nothing due until the effective time; then the clock activates.
	if r, err := k.Tick(ctx, Actor{Name: "authority"}); err != nil || r.Changes != nil {
		t.Fatalf("tick before effect: %+v %v", r, err)
	}
	clock.offset = time.Hour + time.Second
	if r, err := k.Tick(ctx, Actor{Name: "authority"}); err != nil || len(r.Changes) != 2 {
		t.Fatalf("tick at effect: %+v %v", r, err)
	}
	id, sign, err := k.ActiveSigner(ctx)
	// A staged signer's ID is its number and its key's hash.
	v2 := res.Changes[0].To
	if err != nil || id != KeyVersionID("v2", v2.PublicKey) || !strings.HasPrefix(id, "v2-") {
		t.Fatalf("active %s %v", id, err)
	}
	if _, err := sign([]byte("task")); err != nil {
		t.Fatal(err)
	}
	// Roll back inside grace: v1 signs again, v2 is staged again.
	if _, err := k.Rollback(ctx, who); err != nil {
		t.Fatal(err)
	}
	if id, _, _ := k.ActiveSigner(ctx); id != "v1" {
		t.Fatalf("active after rollback = %s", id)
	}
	if _, err := k.Revoke(ctx, who, "v9"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	if _, err := k.Activate(ctx, who); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Retire(ctx, who); err != nil {
		t.Fatal(err)
	}

	var actions []string
	for _, e := range log.events {
		actions = append(actions, e.Action+"="+e.Result)
		if e.Result == audit.ResultOK && !strings.Contains(e.Reason, "verifier set version") {
			t.Errorf("audit reason %q lacks the set version", e.Reason)
		}
	}
	want := "node_task_signer.create=ok node_task_signer.stage=denied node_task_signer.stage=ok node_task_signer.activate=ok " +
		"node_task_signer.rollback=ok node_task_signer.revoke=denied node_task_signer.activate=ok node_task_signer.retire=ok"
	if got := strings.Join(actions, " "); got != want {
		t.Fatalf("audit:\n got %s\nwant %s", got, want)
	}
	if e := log.events[2]; e.Target != v2.VersionID || e.CorrelationID != "c-1" || !strings.Contains(e.Reason, "previous=v1") || !strings.Contains(e.Reason, "grace_until=") {
		t.Fatalf("stage audit = %+v", e)
	}
}

func TestMinLeadTimeFor(t *testing.T) {
	for _, tt := range []struct{ configured, want time.Duration }{
		{0, DefaultMinLeadTime}, {-time.Minute, DefaultMinLeadTime}, {2 * time.Minute, 2 * time.Minute},
	} {
		if got := MinLeadTimeFor(tt.configured); got != tt.want {
			t.Errorf("MinLeadTimeFor(%s) = %s, want %s", tt.configured, got, tt.want)
		}
		if got := NewKeeper(nil, nil, nil, "a", tt.configured).MinLeadTime(); got != tt.want {
			t.Errorf("NewKeeper(%s).MinLeadTime() = %s, want %s", tt.configured, got, tt.want)
		}
	}
}

// TestRefusedRevokeNamesTheVersion: a refused revocation is audited with
// the version the operator named as its target, as an accepted one is;
// its record named no target, so `muster audit list` could not tell which
// revocation was refused.
func TestRefusedRevokeNamesTheVersion(t *testing.T) {
	ctx := t.Context()
	k, _, log := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v9", "v1"} {
		if _, err := k.Revoke(ctx, who, v); err == nil {
			t.Fatalf("revoke %s: accepted", v)
		}
		log.mu.Lock()
		e := log.events[len(log.events)-1]
		log.mu.Unlock()
		if e.Action != "node_task_signer.revoke" || e.Result != audit.ResultDenied || e.Target != v {
			t.Errorf("refused revoke of %s audited as %+v, want denied with target %s", v, e, v)
		}
	}
}

// TestStageRefusesAGraceUnderASecond: a grace under MinGrace is refused
// (a rotate task would carry grace_until equal to effective_at, which
// agents refuse), audited, and stages nothing; MinGrace itself is taken
// and keeps grace_until after effective_at in the task's whole seconds.
func TestStageRefusesAGraceUnderASecond(t *testing.T) {
	ctx := t.Context()
	k, _, log := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	before, _ := k.Load(ctx)
	for _, grace := range []time.Duration{500 * time.Millisecond, time.Second - time.Nanosecond, 0, -time.Second} {
		_, err := k.Stage(ctx, who, time.Hour, grace)
		var te *TimesError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), "at least 1s") || !strings.Contains(err.Error(), "muster signer stage --grace 24h") {
			t.Fatalf("stage with grace %s = %v, want a TimesError naming the 1s minimum and the way out", grace, err)
		}
		if e := log.events[len(log.events)-1]; e.Action != "node_task_signer.stage" || e.Result != audit.ResultDenied {
			t.Errorf("grace %s: audited %+v, want a denied stage", grace, e)
		}
	}
	if after, _ := k.Load(ctx); after.Version() != before.Version() || len(after.Signers) != 1 {
		t.Fatalf("refused stages changed the signers: %+v", after.Signers)
	}
	res, err := k.Stage(ctx, who, time.Hour, MinGrace)
	if err != nil {
		t.Fatalf("stage with grace %s: %v", MinGrace, err)
	}
	staged := res.Changes[0].To
	eff, grace := staged.EffectiveAt.UTC().Format(time.RFC3339), staged.GraceUntil.UTC().Format(time.RFC3339)
	if grace <= eff {
		t.Fatalf("grace_until %s is not after effective_at %s in whole seconds", grace, eff)
	}
}
