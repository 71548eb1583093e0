package signer

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/retrywait"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// memToken is a PKCS#11 token in memory: its references are pkcs11: URIs,
// its objects go on Destroy (already gone is no error, as in a token), and
// down makes every call fail as an unplugged token does.
type memToken struct {
	mu        sync.Mutex
	keys      map[string]ed25519.PrivateKey // by reference
	down      bool
	destroyed int
	tries     int // Destroy calls, failed or not
}

var errTokenDown = errors.New("token not present")

func (m *memToken) Create(_ context.Context, name string, _ custody.Algorithm) (custody.Key, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return custody.Key{}, errTokenDown
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return custody.Key{}, err
	}
	ref := fmt.Sprintf("pkcs11:token=mem;object=muster-signer%%2F%s;id=%%%02x", name, len(m.keys)+1)
	m.keys[ref] = priv
	return custody.Key{Public: pub, Ref: []byte(ref)}, nil
}

func (m *memToken) Signer(_ context.Context, _ string, k custody.Key) (crypto.Signer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return nil, errTokenDown
	}
	priv, ok := m.keys[string(k.Ref)]
	if !ok {
		return nil, custody.ErrKey
	}
	return priv, nil
}

func (m *memToken) Destroy(_ context.Context, _ string, k custody.Key) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tries++
	if m.down {
		return errTokenDown
	}
	if _, ok := m.keys[string(k.Ref)]; ok {
		delete(m.keys, string(k.Ref))
		m.destroyed++
	}
	return nil
}

// memModule is the module memToken says it was opened with.
const memModule = "/usr/lib/softhsm/libsofthsm2.so"

// Module is the token's PKCS#11 library, as custody.Token says.
func (m *memToken) Module() string { return memModule }

func (m *memToken) setDown(down bool) { m.mu.Lock(); m.down = down; m.mu.Unlock() }

func (m *memToken) holds(ref []byte) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.keys[string(ref)]
	return ok
}

// tokenKeeper is a keeper whose new keys are made in tok, on its own
// SQLite store at path (two keepers on one path are two replicas).
func tokenKeeper(t *testing.T, path string, tok *memToken) (*Keeper, *clockStore, *auditLog) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sealed, err := custody.NewSealed(seal.StorageKey{3}, seal.InfoSigner, "muster-signer/")
	if err != nil {
		t.Fatal(err)
	}
	cs := &clockStore{Store: st}
	log := &auditLog{}
	c := NewInCustody(custody.ByRef{New: tok, Sealed: sealed, Token: tok})
	return NewKeeper(cs, c, log, "prod-a3f2e1", 0), cs, log
}

// refsOf reads the signers' key references from the store.
func refsOf(t *testing.T, st Store) map[string][]byte {
	t.Helper()
	rows, _, err := st.ListSigners(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]byte{}
	for _, r := range rows {
		m[r.VersionID] = r.KeyRef
	}
	return m
}

func lastEvent(t *testing.T, log *auditLog, action string) audit.Event {
	t.Helper()
	log.mu.Lock()
	defer log.mu.Unlock()
	for i := len(log.events) - 1; i >= 0; i-- {
		if log.events[i].Action == action {
			return log.events[i]
		}
	}
	t.Fatalf("no %s audit record", action)
	return audit.Event{}
}

// TestEndedSealedSignerKeyGoesWithTheStep: a sealed key is gone from the
// store with the step that ends its signer (a rollback's discard, a
// retirement, a revocation), in the same write; the active signer's key
// stays; the list says destroyed and the audit record says so.
func TestEndedSealedSignerKeyGoesWithTheStep(t *testing.T) {
	ctx := t.Context()
	k, clock, log := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	staged, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	discarded := staged.Changes[0].To.VersionID
	res, err := k.Rollback(ctx, who)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Keys) != 1 || res.Keys[0].VersionID != discarded || res.Keys[0].Err != nil {
		t.Fatalf("rollback's keys: %+v; want %s's destroyed", res.Keys, discarded)
	}
	refs := refsOf(t, clock)
	if len(refs[discarded]) != 0 || len(refs["v1"]) == 0 {
		t.Fatalf("after the rollback the store holds keys %q; want the discarded signer's gone, v1's kept", refs)
	}
	snap, _ := k.Load(ctx)
	if got := snap.KeyCustody(discarded); got != KeyDestroyed {
		t.Errorf("KeyCustody of the discarded signer = %q, want %q", got, KeyDestroyed)
	}
	if got := snap.KeyCustody("v1"); got != "sealed" {
		t.Errorf("KeyCustody of the active signer = %q, want sealed", got)
	}
	if e := lastEvent(t, log, "node_task_signer.rollback"); !strings.Contains(e.Reason, discarded+"'s key (sealed) destroyed") {
		t.Errorf("rollback audit reason %q does not say the key was destroyed", e.Reason)
	}

	// A rotation through to retirement by the clock, then a revocation.
	next, err := k.Stage(ctx, who, time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clock.offset = time.Hour + time.Second
	if _, err := k.Tick(ctx, Actor{Name: "authority"}); err != nil {
		t.Fatal(err)
	}
	clock.offset = 2*time.Hour + 2*time.Second
	retired, err := k.Tick(ctx, Actor{Name: "authority"})
	if err != nil || len(retired.Changes) != 1 || retired.Changes[0].To.State != Retired {
		t.Fatalf("retirement by the clock: %+v %v", retired, err)
	}
	if e := lastEvent(t, log, "node_task_signer.retire"); !strings.Contains(e.Reason, "v1's key (sealed) destroyed") {
		t.Errorf("retire audit reason %q does not say the key was destroyed", e.Reason)
	}
	if refs := refsOf(t, clock); len(refs["v1"]) != 0 || len(refs[next.Changes[0].To.VersionID]) == 0 {
		t.Fatalf("after the retirement the store holds keys %q; want v1's gone, the active one's kept", refs)
	}
	// Revoking a retired signer: its key is gone already, nothing to say.
	rev, err := k.Revoke(ctx, who, "v1")
	if err != nil || len(rev.Keys) != 0 {
		t.Fatalf("revoking the retired v1: %+v %v", rev, err)
	}
	// The active signer still signs; the ended ones' public keys stay in
	// the verifier set for the record.
	if _, sign, err := k.ActiveSigner(ctx); err != nil {
		t.Fatal(err)
	} else if _, err := sign([]byte("task")); err != nil {
		t.Fatal(err)
	}
	raw, err := k.VerifierSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ParseVerifierSet(raw)
	if err != nil {
		t.Fatal(err)
	}
	if key, ok := set.Key("v1"); !ok || key.State != Revoked {
		t.Errorf("the verifier set's v1: %+v %v; want it listed revoked", key, ok)
	}
}

// TestEndedTokenSignerKeyDestroyed: a token signer discarded by a rollback
// loses its token object and then its reference; when the token does not
// answer, the step still succeeds, its audit says the destruction failed,
// the list still names the object, and the leader's pass destroys it once the
// token is back — once between two replicas.
func TestEndedTokenSignerKeyDestroyed(t *testing.T) {
	ctx := t.Context()
	tok := &memToken{keys: map[string]ed25519.PrivateKey{}}
	path := filepath.Join(t.TempDir(), "muster.db")
	k, st, log := tokenKeeper(t, path, tok)
	k2, _, log2 := tokenKeeper(t, path, tok)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	stage := func() (string, []byte) {
		t.Helper()
		res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		id := res.Changes[0].To.VersionID
		ref := refsOf(t, st)[id]
		if !tok.holds(ref) {
			t.Fatalf("staged %s's key %q is not in the token", id, ref)
		}
		return id, ref
	}

	first, ref := stage()
	res, err := k.Rollback(ctx, who)
	if err != nil || len(res.Keys) != 1 || res.Keys[0].Err != nil {
		t.Fatalf("rollback: %+v %v", res, err)
	}
	if tok.holds(ref) {
		t.Fatalf("the rolled-back signer %s's token object is still there", first)
	}
	if got := refsOf(t, st)[first]; len(got) != 0 {
		t.Fatalf("the rolled-back signer's reference %q is still in the store", got)
	}
	if e := lastEvent(t, log, "node_task_signer.rollback"); !strings.Contains(e.Reason, first+"'s key ("+string(ref)+") is destroyed after the step") {
		t.Errorf("rollback audit reason %q does not say the token key goes after the step", e.Reason)
	}
	if e := lastEvent(t, log, "node_task_signer.destroy_key"); e.Target != first || e.Result != audit.ResultOK || !strings.Contains(e.Reason, first+"'s key ("+string(ref)+") destroyed") {
		t.Errorf("destroy_key audit %+v does not say the token key was destroyed", e)
	}

	// The token does not answer: the rollback stands, the key waits.
	second, ref := stage()
	tok.setDown(true)
	res, err = k.Rollback(ctx, who)
	if err != nil || len(res.Keys) != 1 || !errors.Is(res.Keys[0].Err, errTokenDown) {
		t.Fatalf("rollback with the token down: %+v %v", res, err)
	}
	if e := lastEvent(t, log, "node_task_signer.destroy_key"); e.Target != second || e.Result != audit.ResultError || !strings.Contains(e.Reason, "the leader retries it") {
		t.Errorf("destroy_key audit %+v does not say the destruction failed and is retried", e)
	}
	snap, _ := k.Load(ctx)
	if got := snap.KeyCustody(second); got != string(ref) {
		t.Errorf("KeyCustody while the token is down = %q", got)
	}
	if _, err := k.DestroyEnded(ctx, Actor{Name: "authority"}); !errors.Is(err, errTokenDown) {
		t.Fatalf("DestroyEnded with the token down: %v, want its error", err)
	}
	if !tok.holds(ref) || len(refsOf(t, st)[second]) == 0 {
		t.Fatal("a failed destruction dropped the reference: the token object could never be found again")
	}

	// Back: two replicas' passes destroy it once, and one audits it.
	tok.setDown(false)
	var wg sync.WaitGroup
	done := make([][]KeyFate, 2)
	for i, kk := range []*Keeper{k, k2} {
		wg.Go(func() {
			var err error
			if done[i], err = kk.DestroyEnded(ctx, Actor{Name: "authority"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(done[0])+len(done[1]) != 1 {
		t.Fatalf("replicas destroyed %v and %v; want the key once", done[0], done[1])
	}
	if tok.holds(ref) || len(refsOf(t, st)[second]) != 0 {
		t.Fatal("the pending key survived the leader's pass")
	}
	n := 0
	for _, l := range []*auditLog{log, log2} {
		for _, e := range l.events {
			if e.Action == "node_task_signer.destroy_key" && e.Target == second && e.Result == audit.ResultOK {
				n++
				if !strings.Contains(e.Reason, string(ref)+") destroyed") {
					t.Errorf("destroy_key audit %+v", e)
				}
			}
		}
	}
	if n != 1 {
		t.Errorf("%d destroy_key audit records, want 1", n)
	}
	// The active signer's key was never touched.
	if _, sign, err := k.ActiveSigner(ctx); err != nil {
		t.Fatal(err)
	} else if _, err := sign([]byte("task")); err != nil {
		t.Fatalf("the active signer after the passes: %v", err)
	}
	if done, err := k.DestroyEnded(ctx, Actor{Name: "authority"}); err != nil || len(done) != 0 {
		t.Fatalf("a pass with nothing left: %v %v", done, err)
	}
}

// TestDestroyEndedTakesOldRows: signers ended before keys were destroyed
// (rows written by an earlier muster, their reference kept) lose their
// keys at the next pass; live signers keep theirs.
func TestDestroyEndedTakesOldRows(t *testing.T) {
	ctx := t.Context()
	k, clock, log := newKeeper(t)
	sealed, _ := NewSealed(seal.StorageKey{3})
	key := func(id string) Key {
		kk, err := sealed.Generate(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return kk
	}
	now, _ := clock.Now(ctx)
	row := func(id string, st State) store.Signer {
		kk := key(id)
		return store.Signer{VersionID: id, PublicKey: kk.Public, KeyRef: kk.Ref, State: string(st), PublishedAt: now, EffectiveAt: now, EndedAt: now}
	}
	// As the earlier muster wrote them: no DropKey.
	_, err := clock.ApplySignerChanges(ctx, store.SignerSetID{}, []store.SignerChange{
		{To: row("v1", Retired)}, {To: row("v2", Revoked)}, {To: row("v3", Grace)}, {To: row("v4", Active)},
	}, chainLink(audit.Event{Action: "test.setup", Result: audit.ResultOK}, nil).Build)
	if err != nil {
		t.Fatal(err)
	}
	done, err := k.DestroyEnded(ctx, Actor{Name: "authority"})
	if err != nil || len(done) != 2 {
		t.Fatalf("DestroyEnded: %v %v; want v1's and v2's keys", done, err)
	}
	refs := refsOf(t, clock)
	for id, gone := range map[string]bool{"v1": true, "v2": true, "v3": false, "v4": false} {
		if (len(refs[id]) == 0) != gone {
			t.Errorf("%s's key reference %q; destroyed %v wanted", id, refs[id], gone)
		}
	}
	if e := lastEvent(t, log, "node_task_signer.destroy_key"); !strings.Contains(e.Reason, "(sealed) destroyed") {
		t.Errorf("destroy_key audit %+v", e)
	}
}

// TestEndedTokenKeyWithoutTheToken: a token signer rolled back by an
// authority that does not open the token (muster ca migrate-custody
// --rollback) cannot have its object destroyed, then or later: its
// reference is dropped and the audit record says to delete the object by
// hand, so no pass retries it forever.
func TestEndedTokenKeyWithoutTheToken(t *testing.T) {
	ctx := t.Context()
	tok := &memToken{keys: map[string]ed25519.PrivateKey{}}
	path := filepath.Join(t.TempDir(), "muster.db")
	k, st, _ := tokenKeeper(t, path, tok)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Changes[0].To.VersionID
	ref := refsOf(t, st)[id]

	sealed, err := custody.NewSealed(seal.StorageKey{3}, seal.InfoSigner, "muster-signer/")
	if err != nil {
		t.Fatal(err)
	}
	log := &auditLog{}
	without := NewKeeper(st, NewInCustody(custody.ByRef{New: sealed, Sealed: sealed}), log, "prod-a3f2e1", 0)
	res, err = without.Rollback(ctx, who)
	if err != nil || len(res.Keys) != 1 || !res.Keys[0].Left || res.Keys[0].Err != nil {
		t.Fatalf("rollback without the token: %+v %v", res, err)
	}
	if got := refsOf(t, st)[id]; len(got) != 0 {
		t.Fatalf("the reference %q stayed: every pass would retry a token it cannot open", got)
	}
	if !tok.holds(ref) {
		t.Fatal("the object went from a token the keeper does not open")
	}
	// The commands in full (custody.DeleteCommands), the module named
	// MODULE and explained: none is open here. Before, the record said
	// "pkcs11-tool --delete-object", which pkcs11-tool cannot run.
	e := lastEvent(t, log, "node_task_signer.destroy_key")
	for _, want := range append(custody.DeleteCommands("", ref), "MODULE: the token's PKCS#11 library") {
		if e.Target != id || !strings.Contains(e.Reason, want) {
			t.Errorf("destroy_key audit %+v does not say %q", e, want)
		}
	}
}

// TestEndedTokenKeyNamesTheLeftModule: a keeper told the module of the
// token it does not open (muster ca migrate-custody --rollback: the one
// the store recorded) names it in the destroy_key record's commands, so
// they run pasted; before, they said --module MODULE though the module
// was known.
func TestEndedTokenKeyNamesTheLeftModule(t *testing.T) {
	ctx := t.Context()
	tok := &memToken{keys: map[string]ed25519.PrivateKey{}}
	k, st, _ := tokenKeeper(t, filepath.Join(t.TempDir(), "muster.db"), tok)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Changes[0].To.VersionID
	ref := refsOf(t, st)[id]

	sealed, err := custody.NewSealed(seal.StorageKey{3}, seal.InfoSigner, "muster-signer/")
	if err != nil {
		t.Fatal(err)
	}
	const module = "/opt/hsm client/lib/libhsm.so"
	log := &auditLog{}
	without := NewKeeper(st, NewInCustody(custody.ByRef{New: sealed, Sealed: sealed}), log, "prod-a3f2e1", 0).WithLeftModule(module)
	if res, err = without.Rollback(ctx, who); err != nil || len(res.Keys) != 1 || !res.Keys[0].Left {
		t.Fatalf("rollback without the token: %+v %v", res, err)
	}
	e := lastEvent(t, log, "node_task_signer.destroy_key")
	for _, want := range custody.DeleteCommands(module, ref) {
		if !strings.Contains(e.Reason, want) {
			t.Errorf("destroy_key audit %+v does not say %q", e, want)
		}
	}
	if strings.Contains(e.Reason, "MODULE") || strings.Contains(res.Keys[0].String(), "MODULE") {
		t.Errorf("destroy_key audit %+v names MODULE though the module is known", e)
	}
}

// TestDestroyEndedSpacedBacksOff: the leader's pass tries a failing
// destruction of an ended signer's key again after 5 s, then twice as
// long after each failure up to the cap, by the store clock: an hour of
// 5-second passes with the token away makes about 65 tries, not 720 (as
// before, one a pass); once the token is back the key goes within one cap.
func TestDestroyEndedSpacedBacksOff(t *testing.T) {
	ctx := t.Context()
	tok := &memToken{keys: map[string]ed25519.PrivateKey{}}
	k, st, _ := tokenKeeper(t, filepath.Join(t.TempDir(), "muster.db"), tok)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ref := refsOf(t, st)[res.Changes[0].To.VersionID]
	tok.setDown(true)
	if _, err := k.Rollback(ctx, who); err != nil {
		t.Fatal(err)
	}
	waits := &retrywait.Waits{First: 5 * time.Second, Max: time.Minute}
	pass := func() {
		t.Helper()
		st.offset += 5 * time.Second
		if _, err := k.DestroyEndedSpaced(ctx, Actor{Name: "authority"}, waits); err != nil && !errors.Is(err, errTokenDown) {
			t.Fatal(err)
		}
	}
	tok.mu.Lock()
	before := tok.tries
	tok.mu.Unlock()
	for range 720 {
		pass()
	}
	tok.mu.Lock()
	tries := tok.tries - before
	tok.mu.Unlock()
	// 5, 10, 20, 40 s, then one a minute: 4 + 59 in the hour.
	if tries < 55 || tries > 70 {
		t.Fatalf("%d tries in an hour of 5-second passes with the token away; want about 63", tries)
	}
	tok.setDown(false)
	for range 12 {
		pass()
	}
	if tok.holds(ref) || len(refsOf(t, st)[res.Changes[0].To.VersionID]) != 0 {
		t.Fatal("the key is still there a minute (the cap) after the token came back")
	}
}
