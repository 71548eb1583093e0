package sqlite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// batchOf runs fns as one batch of the committer and returns each one's
// answer.
func batchOf(s *SQLite, ctx context.Context, fns ...func(ctx context.Context, tx *writeTx) error) []error {
	batch := make([]*writeOp, len(fns))
	for i, fn := range fns {
		batch[i] = &writeOp{ctx: ctx, fn: fn, done: make(chan error, 1)}
	}
	s.runBatch(batch)
	errs := make([]error, len(batch))
	for i, op := range batch {
		errs[i] = <-op.done
	}
	return errs
}

// insertRow is a write of one row of a table of the test's own.
func insertRow(id string, runs *int, fail error) func(ctx context.Context, tx *writeTx) error {
	return func(ctx context.Context, tx *writeTx) error {
		*runs++
		if _, err := tx.ExecContext(ctx, `INSERT INTO batch_rows (id) VALUES (?)`, id); err != nil {
			return err
		}
		return fail // after writing: what it wrote must not stay
	}
}

func batchRows(t *testing.T, s *SQLite) []string {
	t.Helper()
	rows, err := s.r.QueryContext(t.Context(), `SELECT id FROM batch_rows ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := collect(rows, "rows", func(r scanner) (id string, err error) { return id, r.Scan(&id) })
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func openWithRows(t testing.TB) *SQLite {
	s, _ := openTemp(t)
	if _, err := s.w.ExecContext(t.Context(), `CREATE TABLE batch_rows (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBatchFailedWriteAlone: of a batch, the write that fails leaves
// nothing and hears its own error; the others commit and hear success.
// The writes before the failed one run again, the failed one is answered
// after those (in a savepoint), and one failing first in its transaction
// is answered at once.
func TestBatchFailedWriteAlone(t *testing.T) {
	s := openWithRows(t)
	ctx := t.Context()
	boom := errors.New("boom")
	var a, b, c, d int
	errs := batchOf(s, ctx,
		insertRow("a", &a, nil),
		insertRow("b", &b, boom),
		insertRow("c", &c, nil),
		insertRow("a", &d, nil), // a's key, taken by the first write
	)
	if errs[0] != nil || !errors.Is(errs[1], boom) || errs[2] != nil || errs[3] == nil || errors.Is(errs[3], boom) {
		t.Fatalf("errors %v, want nil, boom, nil, a constraint error", errs)
	}
	if got := batchRows(t, s); fmt.Sprint(got) != "[a c]" {
		t.Fatalf("rows %v, want [a c]", got)
	}
	// a: the first run and the run after b failed; b: without and with a
	// savepoint; c and d: once each, in savepoints.
	if a != 2 || b != 2 || c != 1 || d != 1 {
		t.Fatalf("runs a %d b %d c %d d %d, want 2 2 1 1", a, b, c, d)
	}

	var e, f int
	errs = batchOf(s, ctx, insertRow("e", &e, boom), insertRow("f", &f, nil))
	if !errors.Is(errs[0], boom) || errs[1] != nil {
		t.Fatalf("errors %v, want boom, nil", errs)
	}
	if e != 1 || f != 1 {
		t.Fatalf("runs e %d f %d, want 1 (failed first: final) and 1", e, f)
	}
	if got := batchRows(t, s); fmt.Sprint(got) != "[a c f]" {
		t.Fatalf("rows %v, want [a c f]", got)
	}

	// Every write fails: nothing is written, each hears its own error.
	errs = batchOf(s, ctx, insertRow("g", new(int), boom), insertRow("a", new(int), nil), insertRow("h", new(int), errors.New("bang")))
	if !errors.Is(errs[0], boom) || errs[1] == nil || errs[2] == nil || errs[2].Error() != "bang" {
		t.Fatalf("errors %v", errs)
	}
	if got := batchRows(t, s); fmt.Sprint(got) != "[a c f]" {
		t.Fatalf("rows %v, want [a c f]", got)
	}
}

// TestBatchRenewalsConflict: two renewals of one instance from the same
// generation in one batch, between renewals of other instances: exactly
// one wins, the other hears ErrConflict, and its certificate is not
// recorded.
func TestBatchRenewalsConflict(t *testing.T) {
	s, _ := openTemp(t)
	ctx := t.Context()
	if err := s.InsertToken(ctx, testToken("t1", 0)); err != nil {
		t.Fatal(err)
	}
	var ins []store.Instance
	for i := range 3 {
		res, err := s.CommitJoin(ctx, testJoin("t1", fmt.Sprintf("node-%d", i), fmt.Sprintf("inst-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, res.Instance)
	}
	renew := func(in store.Instance, serial string) func(ctx context.Context, tx *writeTx) error {
		now := time.Now()
		r := store.Renewal{InstanceID: in.ID, FromGeneration: 0, ChainPEM: []byte("chain 1"),
			Audit:       benchLink,
			Certificate: store.Certificate{Serial: serial, PublicKey: []byte("key"), NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}
		c, err := store.PrepareRenewal(r)
		if err != nil {
			t.Fatal(err)
		}
		return func(ctx context.Context, tx *writeTx) error {
			_, err := commitRenewal(ctx, tx, r, c)
			return err
		}
	}
	errs := batchOf(s, ctx,
		renew(ins[0], "a0"), renew(ins[1], "b1"), renew(ins[1], "b2"), renew(ins[2], "c0"))
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], store.ErrConflict) || errs[3] != nil {
		t.Fatalf("errors %v, want nil, nil, ErrConflict, nil", errs)
	}
	for i, in := range ins {
		got, err := s.GetInstance(ctx, in.ID)
		if err != nil || got.Generation != 1 {
			t.Fatalf("instance %d: generation %d, %v; want 1", i, got.Generation, err)
		}
	}
	if got, _ := s.GetInstance(ctx, ins[1].ID); got.LastSerial != "b1" {
		t.Fatalf("instance 1 renewed to %q, want b1", got.LastSerial)
	}
	if _, err := s.GetCertificate(ctx, "b2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the losing renewal's certificate: %v, want ErrNotFound", err)
	}
	// One audit record per winning renewal, chained.
	if h, err := s.AuditHead(ctx); err != nil || h.Seq != 3 {
		t.Fatalf("audit head %d, %v; want 3", h.Seq, err)
	}
}

// TestWriteAloneRunsOnce: a write submitted with writeAlone never shares
// a transaction, so a failure of another write cannot make it run again.
// The writes are queued while the committer is held by a first one, in
// the order they reach it.
func TestWriteAloneRunsOnce(t *testing.T) {
	s := openWithRows(t)
	ctx := t.Context()
	release := make(chan struct{})
	held := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		s.write(ctx, func(ctx context.Context, tx *writeTx) error {
			close(held)
			<-release
			return nil
		})
	})
	<-held
	var aloneRuns int
	var errs [3]error
	queue := func(i int, f func() error) {
		wg.Go(func() { errs[i] = f() })
		time.Sleep(20 * time.Millisecond) // let it block on the queue, in order
	}
	queue(0, func() error { return s.writeAlone(ctx, insertRow("alone", &aloneRuns, nil)) })
	queue(1, func() error { return s.write(ctx, insertRow("x", new(int), nil)) })
	queue(2, func() error { return s.write(ctx, insertRow("y", new(int), errors.New("boom"))) })
	close(release)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || errs[2] == nil {
		t.Fatalf("errors %v, want nil, nil, boom", errs)
	}
	if aloneRuns != 1 {
		t.Fatalf("the alone write ran %d times, want 1", aloneRuns)
	}
	if got := batchRows(t, s); fmt.Sprint(got) != "[alone x]" {
		t.Fatalf("rows %v", got)
	}
}
