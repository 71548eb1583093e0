package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestPutVerifierSetWaitsForAStepInFlight: a replica keeps the set it
// signed at the store's set ID while another replica's step, which moves
// that ID, is in flight (its UPDATE of signer_set done, its COMMIT not
// yet). The put must wait for the step and, once it commits, refuse the
// set: a plain INSERT … SELECT would read the row as it was before the
// step, keep a set of a version gone and report it kept.
func TestPutVerifierSetWaitsForAStepInFlight(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	_, err := s.ApplySignerChanges(ctx, store.SignerSetID{}, []store.SignerChange{{To: store.Signer{VersionID: "v1", PublicKey: []byte("pub"), KeyRef: []byte("ref"),
		State: store.SignerActive, PublishedAt: time.Now()}}}, func(h store.AuditHead) (store.AuditRecord, error) {
		return store.AuditRecord{Seq: h.Seq + 1, PrevHash: h.Hash, Hash: []byte("1"), Time: time.Now(), Action: "node_task_signer.create", Result: "ok"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	read, err := s.SignerSetID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The step in flight, as ApplySignerChanges makes it.
	tx, err := s.pool.p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE signer_set SET version = version + 1, stepped_at = `+nowMicros+` WHERE id = 1 AND version = $1`, read.Version); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.PutVerifierSet(ctx, read, []byte("set of version 1")) }()
	deadline := time.Now().Add(30 * time.Second)
	for waiting := false; !waiting; {
		select {
		case err := <-done:
			t.Fatalf("the put returned %v while a step from its version was in flight; want it to wait for the step", err)
		default:
		}
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		waiting = n > 0
		if !waiting && time.Now().After(deadline) {
			t.Fatal("the put neither returned nor waited on the signer_set row")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the put after the step committed: %v, want ErrConflict", err)
	}
	var kept int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM verifier_sets`).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if kept != 0 {
		t.Fatalf("%d sets kept, want none: the set was of a version gone", kept)
	}
}
