package authority

import (
	"context"
	"crypto"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// destroyCounting is a custody that records every Destroy, delegating
// the rest.
type destroyCounting struct {
	custody.Custody
	mu        *sync.Mutex
	destroyed *[]string
}

func (d destroyCounting) Signer(ctx context.Context, name string, k custody.Key) (crypto.Signer, error) {
	if k.Ref == nil {
		// Every reader of intermediates must skip a retired row's key.
		panic("custody: asked to open a nil key reference for " + name)
	}
	return d.Custody.Signer(ctx, name, k)
}

// Import keeps the wrapped custody's ability to take the data
// directory's intermediates at start.
func (d destroyCounting) Import(ctx context.Context, name string, key crypto.Signer) (custody.Key, error) {
	return d.Custody.(custody.Importer).Import(ctx, name, key)
}

func (d destroyCounting) Destroy(ctx context.Context, name string, k custody.Key) error {
	d.mu.Lock()
	*d.destroyed = append(*d.destroyed, name+"="+string(k.Ref))
	d.mu.Unlock()
	return d.Custody.Destroy(ctx, name, k)
}

// countDestroys is a Config.WrapCACustody recording every Destroy.
func countDestroys(mu *sync.Mutex, destroyed *[]string) func(custody.Custody) (custody.Custody, error) {
	return func(c custody.Custody) (custody.Custody, error) {
		return destroyCounting{Custody: c, mu: mu, destroyed: destroyed}, nil
	}
}

// TestRetiredIntermediateGivesUpItsKey: of two replicas retiring an
// intermediate at once exactly one destroys the key in custody, then
// empties its reference in the store with its ca.destroy_key record; the
// replicas read the retired row again without opening its (absent) key.
func TestRetiredIntermediateGivesUpItsKey(t *testing.T) {
	var mu sync.Mutex
	var destroyed []string
	a := startReplicas(t, nil, 2, noCAClock, func(c *Config) {
		c.CAIntermediateTTL = 3 * time.Minute
		c.WrapCACustody = countDestroys(&mu, &destroyed)
	})
	ctx := t.Context()
	now := time.Now()
	expired := storeIntermediate(t, ctx, a, now.Add(-10*time.Minute), 5*time.Minute)
	storeIntermediate(t, ctx, a, now.Add(-10*time.Second), 3*time.Minute)

	var wg sync.WaitGroup
	for _, s := range a.srvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.caStepAt(ctx, now); err != nil {
				t.Errorf("a replica's step: %v", err)
			}
		}()
	}
	wg.Wait()
	if want := "agent/" + expired.Serial + "=" + string(expired.KeyRef); len(destroyed) != 1 || destroyed[0] != want {
		t.Fatalf("destroyed %q; want exactly one destruction, of the retired intermediate's key %q", destroyed, want)
	}
	rows, err := a.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Serial == expired.Serial && (r.State != store.CARetired || r.KeyRef != nil) {
			t.Fatalf("the expired intermediate after the step: state %s, key reference %q; want retired with no key", r.State, r.KeyRef)
		}
	}
	for _, s := range a.srvs {
		if err := s.inter.load(ctx); err != nil {
			t.Fatalf("reading the intermediates with a retired row: %v", err)
		}
	}
	recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.retire"})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Target != "agent/"+expired.Serial {
		t.Fatalf("ca.retire records %+v; want one for %s", recs, expired.Serial)
	}
	// The retirement is written with its record; the reference leaves
	// the store with the record of the key's destruction, after it.
	destroys, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.destroy_key"})
	if err != nil {
		t.Fatal(err)
	}
	if len(destroys) != 1 || destroys[0].Seq <= recs[0].Seq || destroys[0].Target != "agent/"+expired.Serial ||
		!strings.Contains(destroys[0].Reason, "its key (sealed) destroyed") {
		t.Fatalf("ca.destroy_key records %+v; want one after the ca.retire saying its key was destroyed", destroys)
	}
}

// TestAbandonedDraftKeyDestroyed: the key of a draft whose signed
// certificate never comes back (muster ca rotate --root-key stopped
// between its calls) is destroyed by the leader once ca.draft_ttl has
// passed, audited, and a prepare sent afterwards is told to draft again;
// a draft whose certificate came back is claimed by its prepare and its
// key kept.
func TestAbandonedDraftKeyDestroyed(t *testing.T) {
	var mu sync.Mutex
	var destroyed []string
	b := startReplicas(t, nil, 1, noCAClock, func(c *Config) { c.WrapCACustody = countDestroys(&mu, &destroyed) })
	s := b.srvs[0]
	a := &adminService{s: s}
	ctx := t.Context()
	kept, err := a.DraftCAIntermediate(ctx, &musterv1.DraftCAIntermediateRequest{Role: "server"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.PrepareCAIntermediate(ctx, &musterv1.PrepareCAIntermediateRequest{Role: "server", Serial: kept.GetSerial(), KeyRef: kept.GetKeyRef(),
		CertificateDer: signDraftWith(t, kept, b.h.Root, b.h.RootKey, nil)}); err != nil {
		t.Fatal(err)
	}
	abandoned, err := a.DraftCAIntermediate(ctx, &musterv1.DraftCAIntermediateRequest{Role: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := s.caStepAt(ctx, now); err != nil {
		t.Fatal(err)
	}
	if len(destroyed) != 0 {
		t.Fatalf("a fresh draft's key was destroyed: %q", destroyed)
	}
	if err := s.caStepAt(ctx, now.Add(s.caDraftTTL()+time.Minute)); err != nil {
		t.Fatal(err)
	}
	if want := "agent/" + abandoned.GetSerial() + "=" + string(abandoned.GetKeyRef()); len(destroyed) != 1 || destroyed[0] != want {
		t.Fatalf("destroyed %q; want the abandoned draft's key alone, %q", destroyed, want)
	}
	_, err = a.PrepareCAIntermediate(ctx, &musterv1.PrepareCAIntermediateRequest{Role: "agent", Serial: abandoned.GetSerial(), KeyRef: abandoned.GetKeyRef(),
		CertificateDer: signDraftWith(t, abandoned, b.h.Root, b.h.RootKey, nil)})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "run `muster ca rotate agent --root-key FILE` again") {
		t.Fatalf("a prepare after its draft expired: %v; want a refusal saying to draft again", err)
	}
	recs, err := b.store.ListAudit(ctx, store.AuditFilter{Action: "ca.discard"})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Target != "agent/"+abandoned.GetSerial() || !strings.Contains(recs[0].Reason, "destroyed next (ca.destroy_key)") {
		t.Fatalf("ca.discard records %+v; want one for the abandoned draft saying its key is destroyed next", recs)
	}
	destroys, err := b.store.ListAudit(ctx, store.AuditFilter{Action: "ca.destroy_key"})
	if err != nil {
		t.Fatal(err)
	}
	if len(destroys) != 1 || destroys[0].Target != "agent/"+abandoned.GetSerial() || destroys[0].Seq < recs[0].Seq || !strings.Contains(destroys[0].Reason, "destroyed") {
		t.Fatalf("ca.destroy_key records %+v; want one after the ca.discard saying its key was destroyed", destroys)
	}
}

// auditDown is a store whose audit records cannot be written while down
// is set: neither on their own nor with the write they record.
type auditDown struct {
	store.Store
	down *atomic.Bool
}

var errAuditDown = errors.New("test: the audit log is down")

func (a auditDown) failing(audit func(store.AuditHead) (store.AuditRecord, error)) func(store.AuditHead) (store.AuditRecord, error) {
	if !a.down.Load() {
		return audit
	}
	return func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, errAuditDown }
}

func (a auditDown) AppendAudit(ctx context.Context, audit func(store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error) {
	return a.Store.AppendAudit(ctx, a.failing(audit))
}

func (a auditDown) ClaimCADraft(ctx context.Context, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) (store.CADraft, error) {
	return a.Store.ClaimCADraft(ctx, serial, a.failing(audit))
}

// TestDraftDiscardUnauditedKeepsItsKey: an abandoned draft whose
// ca.discard cannot be recorded is not discarded: the draft and its key
// stay, and the next sweep with the audit log back discards it, recorded.
// Before, the claim and the destruction went ahead and the record was
// written after, or not at all.
func TestDraftDiscardUnauditedKeepsItsKey(t *testing.T) {
	var (
		mu        sync.Mutex
		destroyed []string
		down      atomic.Bool
	)
	b := startReplicas(t, nil, 1, noCAClock, func(c *Config) {
		c.WrapCACustody = countDestroys(&mu, &destroyed)
		c.Store = auditDown{Store: c.Store, down: &down}
	})
	s := b.srvs[0]
	a := &adminService{s: s}
	ctx := t.Context()
	d, err := a.DraftCAIntermediate(ctx, &musterv1.DraftCAIntermediateRequest{Role: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(s.caDraftTTL() + time.Minute)
	down.Store(true)
	_ = s.caStepAt(ctx, later)
	mu.Lock()
	got := slices.Clone(destroyed)
	mu.Unlock()
	if len(got) != 0 {
		t.Fatalf("destroyed %q with the audit log down; want the draft's key kept", got)
	}
	drafts, err := b.store.ListCADrafts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(drafts) != 1 || drafts[0].Serial != d.GetSerial() {
		t.Fatalf("drafts after an unaudited sweep: %+v; want %s kept", drafts, d.GetSerial())
	}
	down.Store(false)
	s.caDraftSwept.Store(time.Time{})
	if err := s.caStepAt(ctx, later.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got = slices.Clone(destroyed)
	mu.Unlock()
	if want := "agent/" + d.GetSerial() + "=" + string(d.GetKeyRef()); len(got) != 1 || got[0] != want {
		t.Fatalf("destroyed %q; want the draft's key, %q", got, want)
	}
	recs, err := b.store.ListAudit(ctx, store.AuditFilter{Action: "ca.discard"})
	if err != nil {
		t.Fatal(err)
	}
	var ok []store.AuditRecord
	for _, r := range recs {
		if r.Result == "ok" {
			ok = append(ok, r)
		}
	}
	if len(ok) != 1 || ok[0].Target != "agent/"+d.GetSerial() {
		t.Fatalf("ca.discard records %+v; want one discard, with the audit log back (and the failed step's error)", recs)
	}
}

// TestExpiredDraftRefusedBeforeSweep: a certificate sent back after
// ca.draft_ttl, before the leader's sweep found the draft, is refused
// naming the setting's value, and that prepare destroys the draft's key
// and audits ca.discard as the sweep would.
func TestExpiredDraftRefusedBeforeSweep(t *testing.T) {
	var mu sync.Mutex
	var destroyed []string
	const ttl = 300 * time.Millisecond
	b := startReplicas(t, nil, 1, noCAClock, func(c *Config) {
		c.WrapCACustody = countDestroys(&mu, &destroyed)
		c.CADraftTTL = ttl
	})
	a := &adminService{s: b.srvs[0]}
	ctx := t.Context()
	d, err := a.DraftCAIntermediate(ctx, &musterv1.DraftCAIntermediateRequest{Role: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	_, err = a.PrepareCAIntermediate(ctx, &musterv1.PrepareCAIntermediateRequest{Role: "agent", Serial: d.GetSerial(), KeyRef: d.GetKeyRef(),
		CertificateDer: signDraftWith(t, d, b.h.Root, b.h.RootKey, nil)})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "past ca.draft_ttl (300ms)") ||
		!strings.Contains(err.Error(), "run `muster ca rotate agent --root-key FILE` again") {
		t.Fatalf("a prepare after ca.draft_ttl: %v; want a refusal naming it and saying to draft again", err)
	}
	mu.Lock()
	got := slices.Clone(destroyed)
	mu.Unlock()
	if want := "agent/" + d.GetSerial() + "=" + string(d.GetKeyRef()); len(got) != 1 || got[0] != want {
		t.Fatalf("destroyed %q; want the expired draft's key, %q", got, want)
	}
	recs, err := b.store.ListAudit(ctx, store.AuditFilter{Action: "ca.discard"})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Target != "agent/"+d.GetSerial() || !strings.Contains(recs[0].Reason, "within ca.draft_ttl (300ms)") {
		t.Fatalf("ca.discard records %+v; want one for the expired draft naming ca.draft_ttl", recs)
	}
	rows, err := b.store.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := preparedOf(rows, "agent"); p != nil {
		t.Fatalf("an expired draft was stored prepared: %+v", p)
	}
}

// destroyFailing is destroyCounting whose Destroy fails while fail is set
// (a token away).
type destroyFailing struct {
	destroyCounting
	fail *atomic.Bool
}

func (d destroyFailing) Destroy(ctx context.Context, name string, k custody.Key) error {
	if d.fail.Load() {
		return errors.New("test: the token is unavailable")
	}
	return d.destroyCounting.Destroy(ctx, name, k)
}

// TestRetiredKeyDestroyedLaterKeepsItsReference: a retired
// intermediate's key that cannot be destroyed (the token away) keeps its
// reference in the store, and no ca.destroy_key record says it was
// destroyed; the leader's next pass destroys it and empties the
// reference with that record. Before, the reference went with the
// retirement, whatever became of the key, and nothing tried again.
func TestRetiredKeyDestroyedLaterKeepsItsReference(t *testing.T) {
	var (
		mu        sync.Mutex
		destroyed []string
		fail      atomic.Bool
	)
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) {
		c.CAIntermediateTTL = time.Hour
		c.WrapCACustody = func(c custody.Custody) (custody.Custody, error) {
			return destroyFailing{destroyCounting: destroyCounting{Custody: c, mu: &mu, destroyed: &destroyed}, fail: &fail}, nil
		}
	})
	ctx := t.Context()
	s := a.srvs[0]
	now := time.Now()
	expired := storeIntermediate(t, ctx, a, now.Add(-10*time.Minute), 5*time.Minute)
	storeIntermediate(t, ctx, a, now.Add(-10*time.Second), time.Hour)
	keyOf := func() (string, []byte) {
		rows, err := a.store.ListCACerts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Serial == expired.Serial {
				return r.State, r.KeyRef
			}
		}
		t.Fatalf("%s is gone from the store", expired.Serial)
		return "", nil
	}
	destroyRecords := func() (ok, failed int) {
		recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.destroy_key"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			switch {
			case r.Target != "agent/"+expired.Serial:
			case r.Result == "ok" && strings.Contains(r.Reason, "destroyed"):
				ok++
			case r.Result == "error":
				failed++
			}
		}
		return ok, failed
	}

	fail.Store(true)
	if err := s.caStepAt(ctx, now); err != nil {
		t.Fatal(err)
	}
	if state, ref := keyOf(); state != store.CARetired || string(ref) != string(expired.KeyRef) {
		t.Fatalf("after a failed destruction: state %s, key reference %q; want retired, the reference kept", state, ref)
	}
	if ok, failed := destroyRecords(); ok != 0 || failed != 1 {
		t.Fatalf("ca.destroy_key records: %d saying destroyed, %d failures; want none and one", ok, failed)
	}
	// Not taken again while the step's own destruction may be under
	// way (on the replica that won, the leader before this one).
	fail.Store(false)
	if err := s.caStepAt(ctx, now.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, ref := keyOf(); ref == nil {
		t.Fatal("the reference was taken again within a step's deadline of the retirement")
	}
	// Nor once a step's deadline has passed since RetiredAt: the
	// winner's destruction starts when its write returns, up to the
	// write's own deadline later, and may still be under way.
	if err := s.caStepAt(ctx, now.Add(caStepTimeout+10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, ref := keyOf(); ref == nil {
		t.Fatal("the reference was taken again while the winner's destruction may be under way (a step's deadline after the retirement)")
	}
	// Failing again, it is not recorded again.
	fail.Store(true)
	later := now.Add(3 * caStepTimeout)
	if err := s.caStepAt(ctx, later); err != nil {
		t.Fatal(err)
	}
	if ok, failed := destroyRecords(); ok != 0 || failed != 1 {
		t.Fatalf("ca.destroy_key records after a second failure: %d saying destroyed, %d failures; want none and one", ok, failed)
	}

	fail.Store(false)
	if err := s.caStepAt(ctx, later.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, ref := keyOf(); ref != nil {
		t.Fatalf("after the key was destroyed the store still has its reference %q", ref)
	}
	mu.Lock()
	got := slices.Clone(destroyed)
	mu.Unlock()
	if want := "agent/" + expired.Serial + "=" + string(expired.KeyRef); len(got) != 1 || got[0] != want {
		t.Fatalf("destroyed %q; want the retired key once, %q", got, want)
	}
	if ok, _ := destroyRecords(); ok != 1 {
		t.Fatalf("%d ca.destroy_key records saying destroyed; want one", ok)
	}
	// Nothing left to do: the next pass destroys nothing.
	if err := s.caStepAt(ctx, later.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := len(destroyed)
	mu.Unlock()
	if n != 1 {
		t.Fatalf("%d destructions after the reference was emptied; want 1", n)
	}
}

// destroyFlaky is a custody whose Destroy of the key named in only
// fails with the reason in why while that is not empty, and counts its
// tries; other keys are destroyed as the wrapped custody does.
type destroyFlaky struct {
	custody.Custody
	only, why *atomic.Value // string
	tries     *atomic.Int64
}

func (d destroyFlaky) Import(ctx context.Context, name string, key crypto.Signer) (custody.Key, error) {
	return d.Custody.(custody.Importer).Import(ctx, name, key)
}

func (d destroyFlaky) Destroy(ctx context.Context, name string, k custody.Key) error {
	if only, _ := d.only.Load().(string); name != only {
		return d.Custody.Destroy(ctx, name, k)
	}
	d.tries.Add(1)
	if why, _ := d.why.Load().(string); why != "" {
		return errors.New(why)
	}
	return d.Custody.Destroy(ctx, name, k)
}

// TestRetiredKeyDestructionBacksOff: a retired intermediate's key whose
// destruction keeps failing (the token away) is tried again less and
// less often, each wait at least the one before and none over
// caDestroyMaxWait, so an hour of clock ticks every 5 s tries it a few
// dozen times, not 720; the failure is recorded once per reason, not per
// try; ca status shows the key destroy pending throughout; and once the
// token answers, the next try, within caDestroyMaxWait, destroys it.
// Before, every tick tried it (720 tries in the hour).
func TestRetiredKeyDestructionBacksOff(t *testing.T) {
	var (
		only, why atomic.Value
		tries     atomic.Int64
	)
	only.Store("")
	why.Store("")
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) {
		c.WrapCACustody = func(c custody.Custody) (custody.Custody, error) {
			return destroyFlaky{Custody: c, only: &only, why: &why, tries: &tries}, nil
		}
	})
	ctx := t.Context()
	s := a.srvs[0]
	now := time.Now()
	expired := storeIntermediate(t, ctx, a, now.Add(-10*time.Minute), 5*time.Minute)
	only.Store(keyName("agent", expired.Serial))
	// Its successor lives long enough that the hour below rotates
	// nothing.
	storeIntermediate(t, ctx, a, now.Add(-10*time.Second), 30*24*time.Hour)
	failures := func() []string {
		recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.destroy_key"})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range recs {
			if r.Target == "agent/"+expired.Serial && r.Result == "error" {
				out = append(out, r.Reason)
			}
		}
		return out
	}
	pending := func() string {
		st, err := s.caStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range st.GetCertificates() {
			if c.GetSerial() == expired.Serial {
				return c.GetKeyCustody()
			}
		}
		t.Fatalf("ca status does not list %s", expired.Serial)
		return ""
	}

	why.Store("test: the token is unavailable")
	// The retirement, and its own try.
	if err := s.caStepAt(ctx, now); err != nil {
		t.Fatal(err)
	}
	// An hour of clock ticks, the token away.
	var at []time.Duration // when, after the first clock try, each try came
	start := now.Add(2 * caStepTimeout)
	for d := time.Duration(0); d <= time.Hour; d += caTick {
		if d == 30*time.Minute {
			why.Store("test: the token refuses the login")
		}
		n := tries.Load()
		if err := s.caStepAt(ctx, start.Add(d)); err != nil {
			t.Fatal(err)
		}
		if tries.Load() > n {
			at = append(at, d)
		}
	}
	if len(at) < 10 || len(at) > 30 {
		t.Fatalf("%d tries in an hour of ticks (%v); want the waits doubling to %s: about 20", len(at), at, caDestroyMaxWait)
	}
	for i := 2; i < len(at); i++ {
		prev, gap := at[i-1]-at[i-2], at[i]-at[i-1]
		if gap < prev || gap > caDestroyMaxWait+caTick {
			t.Fatalf("tries at %v: the wait before try %d is %s after one of %s; want each at least the one before, at most %s", at, i, gap, prev, caDestroyMaxWait)
		}
	}
	if got := failures(); len(got) != 2 || !strings.Contains(got[0], "unavailable") || !strings.Contains(got[1], "refuses the login") {
		t.Fatalf("ca.destroy_key failures recorded: %q; want two, one per reason", got)
	}
	if where := pending(); !strings.HasPrefix(where, "destroy pending: ") {
		t.Fatalf("ca status shows the key as %q while its destruction fails; want destroy pending", where)
	}

	why.Store("")
	end := start.Add(time.Hour)
	for d := caTick; d <= caDestroyMaxWait+caTick; d += caTick {
		if err := s.caStepAt(ctx, end.Add(d)); err != nil {
			t.Fatal(err)
		}
	}
	if where := pending(); where != "destroyed" {
		t.Fatalf("ca status shows the key as %q %s after the token came back; want destroyed", where, caDestroyMaxWait+caTick)
	}
}
