package signer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// swappedStore is the store a running replica reaches through its URL:
// restoring a backup under it puts another database behind the same URL.
type swappedStore struct {
	mu  sync.Mutex
	cur Store
}

func (s *swappedStore) get() Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}
func (s *swappedStore) restore(to Store) { s.mu.Lock(); s.cur = to; s.mu.Unlock() }
func (s *swappedStore) Now(ctx context.Context) (time.Time, error) {
	return s.get().Now(ctx)
}
func (s *swappedStore) ListSigners(ctx context.Context) ([]store.Signer, store.SignerSetID, error) {
	return s.get().ListSigners(ctx)
}
func (s *swappedStore) SignerSetID(ctx context.Context) (store.SignerSetID, error) {
	return s.get().SignerSetID(ctx)
}
func (s *swappedStore) ApplySignerChanges(ctx context.Context, v store.SignerSetID, cs []store.SignerChange, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	return s.get().ApplySignerChanges(ctx, v, cs, audit)
}
func (s *swappedStore) AdvanceSignerSet(ctx context.Context, v store.SignerSetID, to int64, set []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	return s.get().AdvanceSignerSet(ctx, v, to, set, audit)
}
func (s *swappedStore) DropSignerKey(ctx context.Context, id string, ref []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	return s.get().DropSignerKey(ctx, id, ref, audit)
}
func (s *swappedStore) PutVerifierSet(ctx context.Context, v store.SignerSetID, raw []byte) error {
	return s.get().PutVerifierSet(ctx, v, raw)
}
func (s *swappedStore) VerifierSets(ctx context.Context, after int64, limit int) ([]store.PublishedSet, error) {
	return s.get().VerifierSets(ctx, after, limit)
}

// TestVerifierSetAfterARestoreSteppedToTheSameVersion: a replica serves
// the verifier set of version 2 (a staged signer S1); the store is
// restored under it from a backup taken at version 1, and another
// replica stages a different signer S2, which brings the restored store to
// version 2 again. The replica must serve the set naming S2: it had kept
// the set by version alone and served S1, which the store no longer holds.
func TestVerifierSetAfterARestoreSteppedToTheSameVersion(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	sealed, _ := NewSealed(seal.StorageKey{3})
	who := Actor{Name: "ops"}
	live := filepath.Join(dir, "muster.db")
	sw := &swappedStore{cur: openSQLite(t, live)}
	a := NewKeeper(sw, sealed, &auditLog{}, "prod-a3f2e1", 0)
	other := NewKeeper(openSQLite(t, live), sealed, &auditLog{}, "prod-a3f2e1", 0)
	if _, err := other.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	// The backup: the database at version 1 (no write is in flight, so
	// the file and its WAL are consistent).
	backup := filepath.Join(dir, "backup.db")
	copyDB(t, live, backup)
	staged := func(k *Keeper) string {
		res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := rotationOf(res)
		if !ok {
			t.Fatal("no staged signer")
		}
		return s
	}
	s1 := staged(other)
	if v, raw := setVersion(t, a); v != 2 || !names(t, raw, s1) {
		t.Fatalf("before the restore: version %d, want 2 naming %s", v, s1)
	}

	restored := openSQLite(t, backup)
	sw.restore(restored)
	s2 := staged(NewKeeper(restored, sealed, &auditLog{}, "prod-a3f2e1", 0))
	if s1 == s2 {
		t.Fatalf("both stages made %s", s1)
	}
	v, raw := setVersion(t, a)
	if v != 2 || !names(t, raw, s2) || names(t, raw, s1) {
		t.Fatalf("after the restore stepped to version 2: served version %d naming %s: %v; want %s, not %s", v, s2, names(t, raw, s2), s2, s1)
	}
}

// rotationOf is the public key (text form) of the signer a step staged:
// both stages name their signer v2, with keys of their own.
func rotationOf(res Result) (string, bool) {
	for _, c := range res.Changes {
		if c.To.State == Staged {
			return EncodePublicKey(c.To.PublicKey), true
		}
	}
	return "", false
}

// names reports whether the signed set raw lists the key pub.
func names(t *testing.T, raw []byte, pub string) bool {
	t.Helper()
	set, err := ParseVerifierSet(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range set.Keys {
		if k.PublicKey == pub {
			return true
		}
	}
	return false
}

// TestRestoredStoreCatchesUpAgents: agents hold set 3 (a stage and a
// rollback) when the store is restored from a backup at version 1 and a
// new signer is staged there. The new signer gets an ID of its own (the
// number is handed out again, the key hash differs), the authority moves
// the set version past what the agent reports (Advance), and the agent
// takes that set and, through it, the new signer.
func TestRestoredStoreCatchesUpAgents(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	who := Actor{Name: "ops"}
	live := filepath.Join(dir, "muster.db")
	sw := &swappedStore{cur: openSQLite(t, live)}
	k, _ := firstKeeper(t, sw, 3, &auditLog{})
	agent, _ := NewTrust(nil, nil)
	take := func() error {
		raw, err := k.VerifierSet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return agent.Accept(raw, time.Now())
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(dir, "backup.db")
	copyDB(t, live, backup)
	first, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Rollback(ctx, who); err != nil {
		t.Fatal(err)
	}
	if err := take(); err != nil || agent.Version() != 3 {
		t.Fatalf("agent at version %d: %v", agent.Version(), err)
	}

	sw.restore(openSQLite(t, backup))
	again, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id1, id2 := first.Changes[0].To.VersionID, again.Changes[0].To.VersionID
	if id1 == id2 || !strings.HasPrefix(id2, "v2-") {
		t.Fatalf("the restored store staged %s, before the restore %s: one ID for two keys", id2, id1)
	}
	if err := take(); !errors.Is(err, ErrSetStale) {
		t.Fatalf("set of the restored store before it catches up: %v, want stale", err)
	}
	res, err := k.Advance(ctx, Actor{Name: "authority"}, agent.Raw())
	if err != nil || res.Version != 4 {
		t.Fatalf("Advance = %+v, %v", res, err)
	}
	if err := take(); err != nil {
		t.Fatalf("the agent does not take the advanced set: %v", err)
	}
	if _, st, ok := agent.StateAt(id2, time.Now()); !ok || st != Staged {
		t.Fatalf("the new signer is %s (%v) to the agent", st, ok)
	}
	if _, err := k.Advance(ctx, Actor{Name: "authority"}, signedAt(t, k, 4+MaxAdvance+1, "prod-a3f2e1")); err == nil {
		t.Fatal("followed a version far beyond any restore")
	}
	// Not ahead any more: nothing to do.
	if res, err := k.Advance(ctx, Actor{Name: "authority"}, agent.Raw()); err != nil || res.Version != 0 {
		t.Fatalf("Advance when not behind = %+v, %v", res, err)
	}
}

// signedAt is the keeper's current signers as a set of version v for
// authority, signed by the active signer through the keeper's custody.
func signedAt(t *testing.T, k *Keeper, v int64, authority string) []byte {
	t.Helper()
	snap, err := k.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	id, sign, err := k.ActiveSigner(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := NewVerifierSet(authority, v, snap.Signers, snap.Now, 0).Sign(id, sign)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestAdvanceFollowsOnlyVerifiedSets: a heartbeat moves the store's
// version only with a set signed by a key the store holds, for this
// authority, within MaxAdvance; a made-up set, however well formed, moves
// nothing.
func TestAdvanceFollowsOnlyVerifiedSets(t *testing.T) {
	ctx := t.Context()
	log := &auditLog{}
	k, _ := firstKeeper(t, openSQLite(t, filepath.Join(t.TempDir(), "muster.db")), 4, log)
	snap, _ := k.Load(ctx)
	// A set naming the store's v1 but with the agent's own key, signed by it.
	pub, priv, _ := ed25519.GenerateKey(nil)
	forged := snap.Signers[0]
	forged.PublicKey = pub
	fake, err := NewVerifierSet("prod-a3f2e1", 50, []Signer{forged}, snap.Now, 0).Sign(forged.VersionID, func(msg []byte) ([]byte, error) {
		return ed25519.Sign(priv, msg), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, raw := range map[string][]byte{
		"made-up key":       fake,
		"other authority":   signedAt(t, k, 50, "other-b4"),
		"beyond MaxAdvance": signedAt(t, k, 1+MaxAdvance+1, "prod-a3f2e1"),
		"not a set":         []byte("50"),
	} {
		if _, err := k.Advance(ctx, Actor{Name: "authority"}, raw); err == nil {
			t.Errorf("%s: followed", name)
		}
		if v, _ := k.SetVersion(ctx); v != 1 {
			t.Fatalf("%s: store version moved to %d", name, v)
		}
		if last := log.events[len(log.events)-1]; last.Action != "node_task_signer.advance" || last.Result != audit.ResultDenied {
			t.Fatalf("%s: refusal not audited: %+v", name, last)
		}
	}
	res, err := k.Advance(ctx, Actor{Name: "authority"}, signedAt(t, k, 1+MaxAdvance, "prod-a3f2e1"))
	if err != nil || res.Version != 2+MaxAdvance {
		t.Fatalf("a genuine set at MaxAdvance above: %+v, %v", res, err)
	}
}

// TestAdvanceSignsWithAKeyTheAgentsHold: the store was backed up with v2
// staged and restored after agents saw v2 activated (v1 in grace to
// them). The advanced set is signed by v2, which they hold as active, not
// by the store's active v1; a backup from before v2 was staged leaves no
// key the agents hold to sign with, and nothing is published.
func TestAdvanceSignsWithAKeyTheAgentsHold(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	who := Actor{Name: "ops"}
	live := filepath.Join(dir, "muster.db")
	sw := &swappedStore{cur: openSQLite(t, live)}
	k, _ := firstKeeper(t, sw, 6, &auditLog{})
	agent, _ := NewTrust(nil, nil)
	take := func() error {
		raw, err := k.VerifierSet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return agent.Accept(raw, time.Now())
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	copyDB(t, live, filepath.Join(dir, "before-stage.db"))
	if _, err := k.Stage(ctx, who, time.Hour, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	copyDB(t, live, filepath.Join(dir, "staged.db"))
	if _, err := k.Activate(ctx, who); err != nil {
		t.Fatal(err)
	}
	if err := take(); err != nil || agent.Version() != 3 {
		t.Fatalf("agent at %d: %v", agent.Version(), err)
	}

	sw.restore(openSQLite(t, filepath.Join(dir, "before-stage.db")))
	// The agents' set is signed by v2, lost with the backup.
	if _, err := k.Advance(ctx, Actor{Name: "authority"}, agent.Raw()); err == nil {
		t.Fatalf("advance with no key the agents hold as active or staged: %v", err)
	}
	if v, _ := k.SetVersion(ctx); v != 1 {
		t.Fatalf("the store moved to %d with nothing to sign with", v)
	}

	sw.restore(openSQLite(t, filepath.Join(dir, "staged.db")))
	res, err := k.Advance(ctx, Actor{Name: "authority"}, agent.Raw())
	if err != nil || res.Version != 4 {
		t.Fatalf("Advance = %+v, %v", res, err)
	}
	if err := take(); err != nil {
		t.Fatalf("the agent refuses the advanced set: %v", err)
	}
}

// TestAdvanceWithNoCommonSigner: agents hold a set, signed by v2, in
// which v2 is active and v1 retired; the store holds v1 active and v2
// revoked. No key could sign a set they take: nothing is published, and
// the refusal points at the restore procedure.
func TestAdvanceWithNoCommonSigner(t *testing.T) {
	ctx := t.Context()
	k, _ := firstKeeper(t, openSQLite(t, filepath.Join(t.TempDir(), "muster.db")), 7, &auditLog{})
	who := Actor{Name: "ops"}
	if _, err := k.Stage(ctx, who, time.Hour, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	snap, _ := k.Load(ctx)
	theirs := append([]Signer(nil), snap.Signers...)
	var v2 Signer
	for i := range theirs {
		if theirs[i].State == Staged {
			theirs[i].State, v2 = Active, theirs[i]
		} else {
			theirs[i].State = Retired
		}
	}
	raw, err := NewVerifierSet("prod-a3f2e1", 9, theirs, snap.Now, 0).Sign(v2.VersionID, func(msg []byte) ([]byte, error) {
		return k.signWith(ctx, snap, v2, msg)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Revoke(ctx, who, v2.VersionID); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Advance(ctx, Actor{Name: "authority"}, raw); !errors.Is(err, ErrNoCommonSigner) || !strings.Contains(err.Error(), "docs/signer-lifecycle.md") {
		t.Fatalf("Advance: %v, want ErrNoCommonSigner", err)
	}
	if v, _ := k.SetVersion(ctx); v != 3 {
		t.Fatalf("store version %d, want 3 (nothing published)", v)
	}
}

// unkeptStore fails to keep any verifier set while fail is set.
type unkeptStore struct {
	store.Store
	fail bool
}

var errUnkept = errors.New("the store does not keep the set (test)")

func (s *unkeptStore) PutVerifierSet(ctx context.Context, v store.SignerSetID, raw []byte) error {
	if s.fail {
		return errUnkept
	}
	return s.Store.PutVerifierSet(ctx, v, raw)
}

// TestAdvanceKeepsItsSetInTheSameWrite: the store was backed up with v2
// staged and restored after agents saw v2 activated (v1 in grace to
// them), and no set can be kept apart from a write (PutVerifierSet
// fails, as a store that fails right after the advance does). The
// advance still stands with its set, signed by v2, and another replica
// serving the current set afterwards serves that one. Before, the
// advance moved the version and the set was signed and kept in a second
// step: with that step failed, the next replica to serve the version
// found no set before it to sign against and signed with the store's
// active v1, which the agents hold only in grace; they refused it and
// every set after, and had to join again.
func TestAdvanceKeepsItsSetInTheSameWrite(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	who := Actor{Name: "ops"}
	live := filepath.Join(dir, "muster.db")
	sw := &swappedStore{cur: openSQLite(t, live)}
	k, sealed := firstKeeper(t, sw, 6, &auditLog{})
	agent, _ := NewTrust(nil, nil)
	take := func(k *Keeper) error {
		raw, err := k.VerifierSet(ctx)
		if err != nil {
			return err
		}
		return agent.Accept(raw, time.Now())
	}
	if _, err := k.Stage(ctx, who, time.Hour, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := take(k); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(dir, "staged.db")
	copyDB(t, live, backup)
	if _, err := k.Activate(ctx, who); err != nil {
		t.Fatal(err)
	}
	if err := take(k); err != nil || agent.Version() != 3 {
		t.Fatalf("agent at %d: %v", agent.Version(), err)
	}

	restored := &unkeptStore{Store: openSQLite(t, backup), fail: true}
	sw.restore(restored)
	res, advanceErr := k.Advance(ctx, Actor{Name: "authority"}, agent.Raw())
	restored.fail = false
	// Another replica, which never saw the agents' set, serves the
	// advanced version.
	other := NewKeeper(sw, sealed, &auditLog{}, "prod-a3f2e1", 0)
	if err := take(other); err != nil || agent.Version() != 4 {
		t.Fatalf("the agent at %d refuses the set another replica serves after the advance: %v", agent.Version(), err)
	}
	if advanceErr != nil || res.Version != 4 {
		t.Fatalf("Advance with no set kept apart = %+v, %v; want version 4 and no error", res, advanceErr)
	}
}

// unadvancedStore fails every advance of the verifier set version, as a
// database that is down does.
type unadvancedStore struct{ store.Store }

var errDown = errors.New("the database does not answer (test)")

func (unadvancedStore) AdvanceSignerSet(context.Context, store.SignerSetID, int64, []byte, func(store.AuditHead) (store.AuditRecord, error)) error {
	return errDown
}

// TestAdvanceNotWrittenHasNoVersion: an advance whose write fails
// returns a zero Result with the error (a version is an advance made,
// its set kept with it) and is recorded as an error. Before, the Result carried the version it did
// not write.
func TestAdvanceNotWrittenHasNoVersion(t *testing.T) {
	ctx := t.Context()
	sq := openSQLite(t, filepath.Join(t.TempDir(), "muster.db"))
	log := &auditLog{}
	k, sealed := firstKeeper(t, sq, 6, log)
	raw := signedAt(t, k, 3, "prod-a3f2e1")
	down := NewKeeper(unadvancedStore{sq}, sealed, log, "prod-a3f2e1", 0)
	res, err := down.Advance(ctx, Actor{Name: "authority"}, raw)
	if !errors.Is(err, errDown) || res.Version != 0 {
		t.Fatalf("Advance with its write failed = %+v, %v; want a zero Result and the store's error", res, err)
	}
	if last := log.events[len(log.events)-1]; last.Action != "node_task_signer.advance" || last.Result != audit.ResultError {
		t.Fatalf("the failed advance recorded as %+v, want an error record", last)
	}
}

// firstKeeper returns a Keeper over st, its custody sealed with a
// storage key of key, recording to log, with its first signer made by ops.
func firstKeeper(t *testing.T, st Store, key byte, log *auditLog) (*Keeper, *Sealed) {
	t.Helper()
	sealed, _ := NewSealed(seal.StorageKey{key})
	k := NewKeeper(st, sealed, log, "prod-a3f2e1", 0)
	if _, err := k.EnsureFirst(t.Context(), Actor{Name: "ops"}); err != nil {
		t.Fatal(err)
	}
	return k, sealed
}

// openSQLite opens the SQLite store at path for the test, closed after it.
func openSQLite(t *testing.T, path string) *sqlite.SQLite {
	t.Helper()
	st, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// copyDB copies the SQLite database at from, with its WAL, to to: a backup
// taken while no write is in flight, so the file and its WAL agree.
func copyDB(t *testing.T, from, to string) {
	t.Helper()
	for _, suffix := range []string{"", "-wal"} {
		data, err := os.ReadFile(from + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to+suffix, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
