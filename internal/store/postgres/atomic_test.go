package postgres

import (
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestAuditedWritesRefusedByDatabase: a JWT key rotation, a resync
// window's opening and closing, a task's send to nodes or to all, an
// answer, a signer step, an advance and a key's drop whose audit record
// the database refuses (a reason that is not UTF-8) change nothing: each
// write and its record are one transaction, the record inserted with
// COMMIT after the write's batch.
func TestAuditedWritesRefusedByDatabase(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	now, err := s.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	epoch := func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) { return benchLink }
	refusedEpoch := func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) { return refusedByDatabase }
	// What the refused writes would change, set up with records.
	if _, err := s.OpenResync(ctx, store.ResyncOpen{ID: "ep-1", For: time.Hour, OpenedBy: "admin:test"}, epoch); err != nil {
		t.Fatal(err)
	}
	task := store.Task{ID: "t1", Type: "node.report", SignerVersionID: "v1", Signed: []byte("s"), CreatedBy: "test",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := s.InsertTask(ctx, task, []string{"n1"}, benchLink); err != nil {
		t.Fatal(err)
	}
	ref := []byte("pkcs11:token=t;object=muster-signer%2Fv2;id=%01")
	active := store.Signer{VersionID: "v1", PublicKey: []byte("p1"), KeyRef: []byte("r1"), State: store.SignerActive, PublishedAt: now, EffectiveAt: now}
	ended := store.Signer{VersionID: "v2", PublicKey: []byte("p2"), KeyRef: ref, State: store.SignerRetired, PublishedAt: now, EffectiveAt: now, EndedAt: now}
	if _, err := s.ApplySignerChanges(ctx, store.SignerSetID{}, []store.SignerChange{{To: active}, {To: ended}}, benchLink); err != nil {
		t.Fatal(err)
	}
	setID, err := s.SignerSetID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	state := func() string {
		t.Helper()
		k, err1 := s.GetJWTKey(ctx)
		e, err2 := s.ListResyncEpochs(ctx)
		p, err3 := s.PendingTasks(ctx, "n1")
		sg, id, err4 := s.ListSigners(ctx)
		h, err5 := s.AuditHead(ctx)
		return fmt.Sprintf("%+v %+v %+v %+v %+v %d %v %v %v %v %v", k, e, p, sg, id, h.Seq, err1, err2, err3, err4, err5)
	}
	before := state()
	for name, write := range map[string]func() error{
		"RotateJWTKey": func() error {
			k, err := s.GetJWTKey(ctx)
			if err != nil {
				return err
			}
			_, err = s.RotateJWTKey(ctx, k, refusedByDatabase)
			return err
		},
		"CloseResync": func() error { _, err := s.CloseResync(ctx, "admin:test", refusedEpoch); return err },
		"InsertTasks": func() error {
			t2 := task
			t2.ID = "t2"
			return s.InsertTasks(ctx, []store.QueuedTask{{Task: t2, NodeIDs: []string{"n1"}}}, refusedByDatabase)
		},
		"QueueTaskToAll": func() error {
			t3 := task
			t3.ID = "t3"
			_, err := s.QueueTaskToAll(ctx, t3, 10, func([]string) {}, func(int) func(store.AuditHead) (store.AuditRecord, error) { return refusedByDatabase })
			return err
		},
		"RecordTaskResult": func() error { return s.RecordTaskResult(ctx, "t1", "n1", store.TaskOK, "", refusedByDatabase) },
		"ApplySignerChanges": func() error {
			_, err := s.ApplySignerChanges(ctx, setID, []store.SignerChange{{To: store.Signer{VersionID: "v3", PublicKey: []byte("p3"),
				KeyRef: []byte("r3"), State: store.SignerStaged, PublishedAt: now, EffectiveAt: now.Add(time.Hour)}}}, refusedByDatabase)
			return err
		},
		"AdvanceSignerSet": func() error { return s.AdvanceSignerSet(ctx, setID, 5, []byte("set"), refusedByDatabase) },
		"DropSignerKey":    func() error { return s.DropSignerKey(ctx, "v2", ref, refusedByDatabase) },
	} {
		if err := write(); err == nil {
			t.Errorf("%s with a record the database refuses succeeded", name)
		}
		if after := state(); after != before {
			t.Fatalf("%s with a record the database refuses changed the store:\n%s\nwant\n%s", name, after, before)
		}
	}
	// OpenResync, with no window open.
	if _, err := s.CloseResync(ctx, "admin:test", epoch); err != nil {
		t.Fatal(err)
	}
	before = state()
	if _, err := s.OpenResync(ctx, store.ResyncOpen{ID: "ep-2", For: time.Hour, OpenedBy: "admin:test"}, refusedEpoch); err == nil {
		t.Error("OpenResync with a record the database refuses succeeded")
	}
	if after := state(); after != before {
		t.Fatalf("OpenResync with a record the database refuses changed the store:\n%s\nwant\n%s", after, before)
	}
}
