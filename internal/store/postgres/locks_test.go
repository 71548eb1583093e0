package postgres

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// refusedByDatabase builds a record the database itself refuses (a
// reason that is not UTF-8, which a text column does not take).
func refusedByDatabase(h store.AuditHead) (store.AuditRecord, error) {
	r, err := benchLink(h)
	r.Reason = "\xff\xfe"
	return r, err
}

// TestLockAuditRefusedByDatabase: a lock whose audit record the database
// refuses is neither created nor deleted: the lock's write and its
// record are one transaction.
func TestLockAuditRefusedByDatabase(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	held := store.Lock{ID: "l-held", Kind: store.LockNode, Target: "node-1", CreatedBy: "admin", CreatedAt: now}
	if err := s.InsertLock(ctx, held, benchLink); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertLock(ctx, store.Lock{ID: "l-new", Kind: store.LockNode, Target: "node-2", CreatedBy: "admin", CreatedAt: now}, refusedByDatabase); err == nil {
		t.Fatal("InsertLock with a record the database refuses succeeded")
	}
	if err := s.DeleteLock(ctx, held.ID, refusedByDatabase); err == nil {
		t.Fatal("DeleteLock with a record the database refuses succeeded")
	}
	got, err := s.ListLocks(ctx)
	if err != nil || len(got) != 1 || got[0] != held {
		t.Fatalf("locks after refused records: %+v, %v; want only %+v", got, err, held)
	}
	if head, err := s.AuditHead(ctx); err != nil || head.Seq != 1 {
		t.Fatalf("AuditHead = %d, %v; want 1, the first lock's record", head.Seq, err)
	}
}

// TestLockTwoHandles: two replicas create and delete the same locks while
// both append to the audit chain: each lock is created once and deleted
// once, with one record each, and the chain stays whole.
func TestLockTwoHandles(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	const locks, tries, appends = 4, 3, 4
	var errs []error
	round := func(write func(s *Store, id string) error, refused error) int {
		won, e := raceWrites(ctx, h, locks*tries, appends, func(i int) error {
			return write(h[i%2], fmt.Sprintf("l-%d", i%locks))
		}, refused)
		errs = append(errs, e...)
		return won
	}
	created := round(func(s *Store, id string) error {
		return s.InsertLock(ctx, store.Lock{ID: id, Kind: store.LockNode, Target: "node-" + id, CreatedBy: "admin", CreatedAt: now}, benchLink)
	}, store.ErrConflict)
	deleted := round(func(s *Store, id string) error { return s.DeleteLock(ctx, id, benchLink) }, store.ErrNotFound)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if created != locks || deleted != locks {
		t.Fatalf("%d locks created, %d deleted; want %d each", created, deleted, locks)
	}
	recs, err := h[0].ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * (locks + appends); len(recs) != want {
		t.Fatalf("chain holds %d records; want %d (one per lock created or deleted, and the appends)", len(recs), want)
	}
	checkBenchChain(t, recs)
	if got, err := h[1].ListLocks(ctx); err != nil || len(got) != 0 {
		t.Fatalf("ListLocks = %+v, %v; want none", got, err)
	}
}

// TestTokenAuditRefusedByDatabase: a token (plain or bound-keypair)
// whose audit record the database refuses is neither created nor
// deleted.
func TestTokenAuditRefusedByDatabase(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	benchToken(t, s)
	plain := store.Token{ID: "t2", JoinMethod: store.JoinMethodToken, Ciphertext: []byte("c"), Nonce: []byte("n"), CreatedBy: "admin", CreatedAt: time.Now()}
	bound := store.Token{ID: "bk", JoinMethod: store.JoinMethodBoundKeypair, Ciphertext: []byte("c"), Nonce: []byte("n"), CreatedBy: "admin", CreatedAt: time.Now(),
		BoundKeypair: &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryMode: store.RecoveryStandard, RecoveryLimit: 1}}}
	for _, tok := range []store.Token{plain, bound} {
		if err := s.InsertToken(ctx, tok, refusedByDatabase); err == nil {
			t.Fatalf("InsertToken %s with a record the database refuses succeeded", tok.ID)
		}
	}
	if err := s.DeleteToken(ctx, "t1", refusedByDatabase); err == nil {
		t.Fatal("DeleteToken with a record the database refuses succeeded")
	}
	got, err := s.ListTokens(ctx)
	if err != nil || len(got) != 1 || got[0].ID != "t1" {
		t.Fatalf("tokens after refused records: %+v, %v; want only t1", got, err)
	}
	if head, err := s.AuditHead(ctx); err != nil || head.Seq != 1 {
		t.Fatalf("AuditHead = %d, %v; want 1, the first token's record", head.Seq, err)
	}
	if err := s.InsertToken(ctx, bound, benchLink); err != nil {
		t.Fatalf("InsertToken %s with its record: %v", bound.ID, err)
	}
}

// TestNodeAuditRefusedByDatabase: a node whose agent.delete record the
// database refuses is not deleted: its row, its current instance and the
// chain stay as they were.
func TestNodeAuditRefusedByDatabase(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	benchToken(t, s)
	if _, err := s.CommitJoin(ctx, benchJoin(1)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteNode(ctx, "node-1", refusedByDatabase); err == nil {
		t.Fatal("DeleteNode with a record the database refuses succeeded")
	}
	if _, err := s.GetNode(ctx, "node-1"); err != nil {
		t.Fatalf("GetNode after the refused delete: %v; want the node", err)
	}
	if in, err := s.GetInstance(ctx, "i-node-1"); err != nil || in.State != store.InstanceCurrent {
		t.Fatalf("instance after the refused delete: %+v, %v; want current", in, err)
	}
	if head, err := s.AuditHead(ctx); err != nil || head.Seq != 1 {
		t.Fatalf("AuditHead = %d, %v; want 1, the token's record", head.Seq, err)
	}
	if err := s.DeleteNode(ctx, "node-1", benchLink); err != nil {
		t.Fatalf("DeleteNode with its record: %v", err)
	}
	if in, err := s.GetInstance(ctx, "i-node-1"); err != nil || in.State != store.InstanceDeleted {
		t.Fatalf("instance after the delete: %+v, %v; want deleted", in, err)
	}
}

// TestPSKAuditRefusedByDatabase: a PSK rotation or grace expiry whose
// audit record the database refuses changes no PSK.
func TestPSKAuditRefusedByDatabase(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	now, err := s.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []store.PSK{
		{ID: "g", Ciphertext: []byte{1}, Nonce: []byte{2}, Status: store.PSKGrace, CreatedAt: now.Add(-time.Hour), GraceExpiresAt: now.Add(-time.Minute)},
		{ID: "a", Ciphertext: []byte{1}, Nonce: []byte{2}, Status: store.PSKActive, CreatedAt: now},
	} {
		if err := s.InsertPSK(ctx, p, benchLink); err != nil {
			t.Fatal(err)
		}
	}
	before, err := s.ListPSKs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := store.PSK{ID: "b", Ciphertext: []byte{3}, Nonce: []byte{4}}
	if _, err := s.RotatePSK(ctx, "a", next, time.Hour, refusedByDatabase); err == nil {
		t.Fatal("RotatePSK with a record the database refuses succeeded")
	}
	refused := func([]string) func(store.AuditHead) (store.AuditRecord, error) { return refusedByDatabase }
	if _, err := s.RevokeExpiredGracePSKs(ctx, refused); err == nil {
		t.Fatal("RevokeExpiredGracePSKs with a record the database refuses succeeded")
	}
	after, err := s.ListPSKs(ctx)
	if err != nil || !reflect.DeepEqual(after, before) {
		t.Fatalf("PSKs after refused records: %+v, %v; want %+v", after, err, before)
	}
	if head, err := s.AuditHead(ctx); err != nil || head.Seq != 2 {
		t.Fatalf("AuditHead = %d, %v; want 2 (the PSKs' own)", head.Seq, err)
	}
	if _, err := s.RotatePSK(ctx, "a", next, time.Hour, benchLink); err != nil {
		t.Fatalf("RotatePSK with its record: %v", err)
	}
}

// TestCAAuditRefusedByDatabase: a CA write (an intermediate stored,
// activated, retired; the root rotation written) or a token cleanup whose
// audit record the database refuses changes nothing, and a retirement
// hands out no key reference.
func TestCAAuditRefusedByDatabase(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	row := func(serial, state string) store.CACert {
		return store.CACert{Role: "agent", Serial: serial, CertDER: []byte("der"), KeyRef: []byte("ref-" + serial), State: state, NotAfter: time.Now().Add(time.Hour)}
	}
	if err := s.InsertCACert(ctx, row("a1", store.CAActive), benchLink); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertCACert(ctx, row("a2", store.CAPrepared), refusedByDatabase); err == nil {
		t.Fatal("InsertCACert with a record the database refuses succeeded")
	}
	if err := s.InsertCACert(ctx, row("a2", store.CAPrepared), benchLink); err != nil {
		t.Fatal(err)
	}
	if err := s.ActivateCACert(ctx, "agent", "a2", refusedByDatabase); err == nil {
		t.Fatal("ActivateCACert with a record the database refuses succeeded")
	}
	if err := s.ActivateCACert(ctx, "agent", "a2", benchLink); err != nil {
		t.Fatal(err)
	}
	if ref, err := s.RetireCACert(ctx, "agent", "a1", refusedByDatabase); err == nil || ref != nil {
		t.Fatalf("RetireCACert with a record the database refuses: %q, %v; want an error and no reference", ref, err)
	}
	if err := s.PutRootRotation(ctx, store.RootRotation{}, store.RootRotation{Phase: store.RootPhaseInit}, true, refusedByDatabase); err == nil {
		t.Fatal("PutRootRotation with a record the database refuses succeeded")
	}
	rows, err := s.ListCACerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, r := range rows {
		states[r.Serial] = r.State
	}
	if want := map[string]string{"a1": store.CARetiring, "a2": store.CAActive}; !reflect.DeepEqual(states, want) {
		t.Fatalf("intermediates after refused records: %v; want %v", states, want)
	}
	if rot, err := s.GetRootRotation(ctx); err != nil || rot.Version != 0 {
		t.Fatalf("root rotation after a refused record: %+v, %v; want none", rot, err)
	}
	if head, err := s.AuditHead(ctx); err != nil || head.Seq != 3 {
		t.Fatalf("AuditHead = %d, %v; want 3 (the successful writes' own)", head.Seq, err)
	}
	if ref, err := s.RetireCACert(ctx, "agent", "a1", benchLink); err != nil || string(ref) != "ref-a1" {
		t.Fatalf("RetireCACert with its record: %q, %v", ref, err)
	}
}
