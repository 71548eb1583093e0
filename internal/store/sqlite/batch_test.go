package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
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
	if err := s.InsertToken(ctx, testToken("t1", 0), benchLink); err != nil {
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
	// One audit record per winning renewal, chained, after the token's.
	if h, err := s.AuditHead(ctx); err != nil || h.Seq != 4 {
		t.Fatalf("audit head %d, %v; want 4", h.Seq, err)
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

// holdWriter starts a write that leads its batch and blocks until release
// is closed, and returns once it runs: writes submitted meanwhile queue.
func holdWriter(t *testing.T, s *SQLite, release <-chan struct{}) (done <-chan error) {
	t.Helper()
	running := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- s.write(context.Background(), func(ctx context.Context, tx *writeTx) error {
			close(running)
			<-release
			_, err := tx.ExecContext(ctx, `INSERT INTO batch_rows (id) VALUES ('held')`)
			return err
		})
	}()
	<-running
	return errc
}

// waitQueued waits until n writes are queued behind the running batch.
func waitQueued(t *testing.T, s *SQLite, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.writeMu.Lock()
		got := len(s.queue)
		s.writeMu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued, want %d", got, n)
		}
	}
}

// within fails t unless errc answers in 10 s (a lost leader hangs).
func within(t *testing.T, errc <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer", what)
		return nil
	}
}

// TestBatchHandOver: the writes queued behind a batch run in batches of
// at most maxBatch, in order, each led by its own caller: the leader of a
// batch returns once its batch has committed, while the next batch (here
// blocked) still runs, and a write alone stops a batch.
func TestBatchHandOver(t *testing.T) {
	s := openWithRows(t)
	release := make(chan struct{})
	held := holdWriter(t, s, release)

	var (
		mu  sync.Mutex
		txs []*writeTx // kept reachable: no two transactions share an address
		ids []string
	)
	write := func(id string, alone bool, block <-chan struct{}) <-chan error {
		errc := make(chan error, 1)
		fn := func(ctx context.Context, tx *writeTx) error {
			if block != nil {
				<-block
			}
			mu.Lock()
			txs, ids = append(txs, tx), append(ids, id)
			mu.Unlock()
			_, err := tx.ExecContext(ctx, `INSERT INTO batch_rows (id) VALUES (?)`, id)
			return err
		}
		go func() {
			if alone {
				errc <- s.writeAlone(context.Background(), fn)
			} else {
				errc <- s.write(context.Background(), fn)
			}
		}()
		return errc
	}
	// Behind the held write: a write that blocks until unblock, then
	// maxBatch+6 writes, a write alone and two more.
	unblock := make(chan struct{})
	first := write("a000", false, unblock)
	waitQueued(t, s, 1)
	var errcs []<-chan error
	for i := range maxBatch + 6 {
		errcs = append(errcs, write(fmt.Sprintf("b%03d", i), false, nil))
		waitQueued(t, s, 2+i) // in order
	}
	errcs = append(errcs, write("c000", true, nil))
	waitQueued(t, s, maxBatch+8)
	errcs = append(errcs, write("d000", false, nil))
	waitQueued(t, s, maxBatch+9)
	errcs = append(errcs, write("d001", false, nil))
	waitQueued(t, s, maxBatch+10)

	close(release)
	// The held write's caller hears its commit although the next batch,
	// led by a000's caller, is blocked in a000.
	if err := within(t, held, "the first leader"); err != nil {
		t.Fatal(err)
	}
	close(unblock)
	for i, errc := range append([]<-chan error{first}, errcs...) {
		if err := within(t, errc, fmt.Sprint("write ", i)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.IsSorted(ids) {
		t.Fatalf("writes ran in the order %v", ids)
	}
	if got, want := fmt.Sprint(batchSizes(txs)), fmt.Sprint([]int{maxBatch, 7, 1, 2}); got != want {
		t.Fatalf("batch sizes %s, want %s", got, want)
	}
	if got := len(batchRows(t, s)); got != maxBatch+11 {
		t.Fatalf("%d rows, want %d", got, maxBatch+11)
	}
}

// TestBatchContextEnds: a queued write whose caller's context ends leaves
// the queue and hears the context's error without waiting for the batch
// running; a leader whose context ends while it is chosen still leads,
// and one whose context ends while its write runs hears its commit.
func TestBatchContextEnds(t *testing.T) {
	s := openWithRows(t)
	release := make(chan struct{})
	held := holdWriter(t, s, release)

	ctx, cancel := context.WithCancel(context.Background())
	var runs int
	queued := make(chan error, 1)
	go func() { queued <- s.write(ctx, insertRow("b", &runs, nil)) }()
	waitQueued(t, s, 1)
	cancel()
	if err := within(t, queued, "the cancelled write"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled write: %v, want context.Canceled", err)
	}
	waitQueued(t, s, 0)

	// Queued behind the held write: e, whose context ends when the held
	// write commits (before or after e's caller is chosen to lead), and f.
	ctxE, cancelE := context.WithCancel(context.Background())
	e := make(chan error, 1)
	go func() { e <- s.write(ctxE, insertRow("e", &runs, nil)) }()
	waitQueued(t, s, 1)
	f := make(chan error, 1)
	go func() { f <- s.write(context.Background(), insertRow("f", new(int), nil)) }()
	waitQueued(t, s, 2)
	cancelE()
	close(release)
	if err := within(t, held, "the held write"); err != nil {
		t.Fatal(err)
	}
	if err := within(t, e, "e"); !errors.Is(err, context.Canceled) {
		t.Fatalf("e: %v, want context.Canceled", err)
	}
	if err := within(t, f, "f"); err != nil {
		t.Fatalf("f: %v", err)
	}
	if runs != 0 {
		t.Fatalf("a cancelled write ran %d times", runs)
	}

	// A leader whose context ends while its write runs: it commits.
	ctxG, cancelG := context.WithCancel(context.Background())
	err := s.write(ctxG, func(ctx context.Context, tx *writeTx) error {
		cancelG()
		_, err := tx.ExecContext(ctx, `INSERT INTO batch_rows (id) VALUES ('g')`)
		return err
	})
	if err != nil {
		t.Fatalf("g: %v", err)
	}
	if got := batchRows(t, s); fmt.Sprint(got) != "[f g held]" {
		t.Fatalf("rows %v, want [f g held]", got)
	}
}

// TestBatchPanic: a write whose fn panics fails alone: its caller panics
// with the same value (whichever goroutine ran it), what it wrote is
// undone, the writes batched with it commit, and the writer still works.
func TestBatchPanic(t *testing.T) {
	s := openWithRows(t)
	release := make(chan struct{})
	held := holdWriter(t, s, release)

	write := func(fn func(ctx context.Context, tx *writeTx) error) <-chan any {
		c := make(chan any, 1)
		go func() {
			defer func() { c <- panicValue(recover()) }()
			if err := s.write(context.Background(), fn); err != nil {
				c <- err
			}
		}()
		return c
	}
	panicky := func(id string) func(ctx context.Context, tx *writeTx) error {
		return func(ctx context.Context, tx *writeTx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO batch_rows (id) VALUES (?)`, id); err != nil {
				return err
			}
			panic("boom " + id)
		}
	}
	a := write(insertRow("a", new(int), nil))
	waitQueued(t, s, 1)
	b := write(panicky("b"))
	waitQueued(t, s, 2)
	c := write(insertRow("c", new(int), nil))
	waitQueued(t, s, 3)
	close(release)
	if err := within(t, held, "held"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		c    <-chan any
		want any
	}{{a, nil}, {b, "boom b"}, {c, nil}} {
		select {
		case got := <-w.c:
			if got != w.want {
				t.Fatalf("got %v, want %v", got, w.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no answer")
		}
	}
	// Leading alone: the same, and the writer is free after it.
	if got := <-write(panicky("d")); got != "boom d" {
		t.Fatalf("got %v, want boom d", got)
	}
	if err := s.write(context.Background(), insertRow("e", new(int), nil)); err != nil {
		t.Fatal(err)
	}
	if got := batchRows(t, s); fmt.Sprint(got) != "[a c e held]" {
		t.Fatalf("rows %v, want [a c e held]", got)
	}
}

// panicValue is the value a write's fn panicked with, from what its
// caller recovered (a *writePanic), or r itself if it is not one.
func panicValue(r any) any {
	if p, ok := r.(*writePanic); ok {
		return p.value
	}
	return r
}

// panicInWrite is a write's fn that panics, under a name its stack shows.
//
//go:noinline
func panicInWrite(ctx context.Context, tx *writeTx) error {
	panic("boom in panicInWrite")
}

// TestBatchPanicStack: the panic a write's caller raises when its fn
// panicked, in the leader's goroutine or its own, says where fn panicked:
// its message holds fn's stack (the caller's own stack does not).
func TestBatchPanicStack(t *testing.T) {
	s := openWithRows(t)
	release := make(chan struct{})
	held := holdWriter(t, s, release)
	write := func() <-chan any {
		c := make(chan any, 1)
		go func() {
			defer func() { c <- recover() }()
			c <- s.write(context.Background(), panicInWrite)
		}()
		return c
	}
	leader := make(chan error, 1)
	go func() { leader <- s.write(context.Background(), insertRow("a", new(int), nil)) }()
	waitQueued(t, s, 1)
	follower := write() // run by the leader's goroutine, in its batch
	waitQueued(t, s, 2)
	close(release)
	for _, err := range []error{within(t, held, "held"), within(t, leader, "leader")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range []<-chan any{follower, write() /* leads alone */} {
		var got any
		select {
		case got = <-c:
		case <-time.After(10 * time.Second):
			t.Fatal("no answer")
		}
		msg := fmt.Sprint(got)
		if !strings.Contains(msg, "boom in panicInWrite") || !strings.Contains(msg, "sqlite.panicInWrite(") {
			t.Errorf("write %d: its caller panicked with %q, want the value and panicInWrite's frame", i, msg)
		}
		if panicValue(got) != "boom in panicInWrite" {
			t.Errorf("write %d: panic value %v", i, panicValue(got))
		}
	}
}

// TestBatchClose: Close waits for the batch running, whose writes commit;
// the writes queued behind it and those submitted after hear that the
// store is closed, and are not written.
func TestBatchClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "muster.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(t.Context(), `CREATE TABLE batch_rows (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	closed := make(chan error, 1)
	running := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- s.write(context.Background(), func(ctx context.Context, tx *writeTx) error {
			close(running)
			<-release
			select {
			case <-closed:
				return errors.New("Close returned while a batch ran")
			default:
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO batch_rows (id) VALUES ('a')`)
			return err
		})
	}()
	<-running
	queued := make(chan error, 1)
	go func() { queued <- s.write(context.Background(), insertRow("b", new(int), nil)) }()
	waitQueued(t, s, 1)
	go func() { closed <- s.Close() }()
	for {
		s.writeMu.Lock()
		c := s.writeClosed
		s.writeMu.Unlock()
		if c {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a Close that did not wait would return now
	close(release)
	if err := within(t, held, "the running write"); err != nil {
		t.Fatal(err)
	}
	if err := within(t, queued, "the queued write"); !errors.Is(err, errClosed) {
		t.Fatalf("queued write: %v, want the store closed", err)
	}
	if err := within(t, closed, "Close"); err != nil {
		t.Fatal(err)
	}
	if err := s.write(context.Background(), insertRow("c", new(int), nil)); !errors.Is(err, errClosed) {
		t.Fatalf("write after Close: %v, want the store closed", err)
	}
	s, err = Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := batchRows(t, s); fmt.Sprint(got) != "[a]" {
		t.Fatalf("rows %v, want [a]", got)
	}
}

// TestFollowChosenLeader: a write chosen to lead stays queued and leads
// even if its caller's context ended, as the writes behind it wait for
// its batch.
func TestFollowChosenLeader(t *testing.T) {
	s := openWithRows(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 50 { // follow finds both its answer and its context ready
		op := &writeOp{ctx: ctx, lead: true, done: make(chan error, 1)}
		op.done <- errLead
		s.writeMu.Lock()
		s.queue, s.leading = []*writeOp{op}, true
		s.writeMu.Unlock()
		err := s.follow(op)
		s.writeMu.Lock()
		queued := slices.Equal(s.queue, []*writeOp{op})
		s.queue, s.leading = nil, false
		s.writeMu.Unlock()
		if err != errLead || !queued {
			t.Fatalf("follow: %v, still queued %v; want errLead, true", err, queued)
		}
	}
}

// TestBatchGoexit: a write whose fn ends its goroutine (runtime.Goexit,
// as t.FailNow does) ends the batch that runs it: no write of that batch
// committed, so none of their callers may hear of success, and the
// writer is handed over.
func TestBatchGoexit(t *testing.T) {
	s := openWithRows(t)
	release := make(chan struct{})
	held := holdWriter(t, s, release)

	// Behind the held write: x, whose caller leads the next batch, then
	// g, whose fn (run by x's caller) ends its goroutine, then y.
	x := make(chan error, 1)
	go func() { x <- s.write(context.Background(), insertRow("x", new(int), nil)) }()
	waitQueued(t, s, 1)
	g := make(chan error, 1)
	go func() {
		g <- s.write(context.Background(), func(ctx context.Context, tx *writeTx) error {
			runtime.Goexit()
			return nil
		})
	}()
	waitQueued(t, s, 2)
	y := make(chan error, 1)
	go func() { y <- s.write(context.Background(), insertRow("y", new(int), nil)) }()
	waitQueued(t, s, 3)
	close(release)
	if err := within(t, held, "held"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		errc <-chan error
	}{{"g", g}, {"y", y}} {
		if err := within(t, c.errc, c.name); err == nil {
			t.Errorf("%s heard success, but its batch never committed", c.name)
		}
	}
	select {
	case err := <-x:
		t.Fatalf("x's caller, whose goroutine ended, returned %v", err)
	default:
	}
	// The writer was handed over: it still works.
	if err := s.write(context.Background(), insertRow("z", new(int), nil)); err != nil {
		t.Fatal(err)
	}
	if got := batchRows(t, s); fmt.Sprint(got) != "[held z]" {
		t.Fatalf("rows %v, want [held z]", got)
	}
}

// TestWriteTxStmtKept: the writes of a batch that run the same cached
// statement share the transaction's one handle of it, and it still runs
// after a failed write's rollback to its savepoint and in the
// transaction run again.
func TestWriteTxStmtKept(t *testing.T) {
	s := openWithRows(t)
	ctx := t.Context()
	// The statement is prepared between transactions, once seen in one.
	if errs := batchOf(s, ctx, insertRow("p", new(int), nil)); errs[0] != nil {
		t.Fatal(errs[0])
	}
	s.wstmts.preparePending(ctx)
	var handles []*sql.Stmt
	fail := errors.New("fails after writing")
	write := func(id string, fail error) func(ctx context.Context, tx *writeTx) error {
		return func(ctx context.Context, tx *writeTx) error {
			if err := insertRow(id, new(int), fail)(ctx, tx); err != nil {
				return err
			}
			handles = append(handles, tx.stmts[0].st)
			if len(tx.stmts) != 1 {
				t.Errorf("%s: %d statement handles, want 1", id, len(tx.stmts))
			}
			return nil
		}
	}
	errs := batchOf(s, ctx, write("a", nil), write("b", fail), write("c", nil))
	if errs[0] != nil || !errors.Is(errs[1], fail) || errs[2] != nil {
		t.Fatalf("answers %v, want nil, %v, nil", errs, fail)
	}
	// a ran in the first transaction, which rolled back at b; then a, b
	// (rolled back to its savepoint) and c in the second, on its one handle.
	if len(handles) != 3 || handles[1] != handles[2] || handles[0] == handles[1] {
		t.Errorf("handles %v: want one for the first transaction, one for the second", handles)
	}
	if got := fmt.Sprint(batchRows(t, s)); got != "[a c p]" {
		t.Fatalf("rows %s, want [a c p]", got)
	}
}

// TestWriteTxStmtOtherContext: a statement handle the transaction keeps
// serves the writes after the one that made it, whatever that write's
// context did: a write whose context had ended when the handle was made
// must not leave the handle failing for the next write.
func TestWriteTxStmtOtherContext(t *testing.T) {
	s := openWithRows(t)
	ctx := t.Context()
	if errs := batchOf(s, ctx, insertRow("p", new(int), nil)); errs[0] != nil {
		t.Fatal(errs[0])
	}
	s.wstmts.preparePending(ctx)
	sqlTx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlTx.Rollback()
	tx := newWriteTx(sqlTx, s.wstmts)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := insertRow("a", new(int), nil)(ended, tx); !errors.Is(err, context.Canceled) {
		t.Fatalf("a write with an ended context: %v, want %v", err, context.Canceled)
	}
	if err := insertRow("b", new(int), nil)(ctx, tx); err != nil {
		t.Fatalf("the next write, on the kept handle: %v", err)
	}
}

// TestAuditHeadKeptInTransaction: the writes of a batch after one that
// appended to the audit chain append on the head the transaction kept,
// without reading it; a write rolled back to its savepoint takes its
// record's head with it, and the next append reads the head again. Each
// write checks the kept head against the chain's last record read in the
// transaction, and the chain committed is whole, with its clock step.
func TestAuditHeadKeptInTransaction(t *testing.T) {
	s := openWithRows(t)
	ctx := t.Context()
	t0 := time.Now()
	boom := errors.New("fails after appending")
	var known []string // each run's write and whether it found the head kept
	appending := func(id string, at time.Time, fail error) func(ctx context.Context, tx *writeTx) error {
		return func(ctx context.Context, tx *writeTx) error {
			known = append(known, fmt.Sprintf("%s:%v", id, tx.head.known))
			if _, err := appendAudit(ctx, tx, func(head store.AuditHead) (store.AuditRecord, error) {
				seq := head.Seq + 1
				return store.AuditRecord{Seq: seq, Time: at, Actor: "a", Action: "test." + id, Target: "t",
					Result: "ok", PrevHash: head.Hash, Hash: []byte(fmt.Sprintf("%s-%d", id, seq))}, nil
			}); err != nil {
				return err
			}
			h, tm, err := chainHead(ctx, tx.Tx) // the database's, not the kept one
			if err != nil {
				return err
			}
			if !tx.head.known || tx.head.head.Seq != h.Seq || !bytes.Equal(tx.head.head.Hash, h.Hash) || tx.head.time != tm {
				t.Errorf("%s: kept head %+v, the chain's %+v at %d", id, tx.head, h, tm)
			}
			return fail
		}
	}
	errs := batchOf(s, ctx,
		appending("a", t0, nil),
		appending("b", t0.Add(time.Second), boom),
		appending("c", t0.Add(2*time.Second), nil),
		appending("d", t0.Add(-time.Hour), nil), // the clock stepped back
	)
	if errs[0] != nil || !errors.Is(errs[1], boom) || errs[2] != nil || errs[3] != nil {
		t.Fatalf("answers %v, want nil, %v, nil, nil", errs, boom)
	}
	// The first transaction: a, then b on a's head, rolled back at b. The
	// second: a again, b in its savepoint on a's head, rolled back; c
	// reads the head again, d appends on c's.
	want := "[a:false b:true a:false b:true c:false d:true]"
	if got := fmt.Sprint(known); got != want {
		t.Errorf("runs and kept heads %s, want %s", got, want)
	}
	recs, err := s.ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var prev []byte
	for _, r := range recs {
		got = append(got, fmt.Sprintf("%d:%s", r.Seq, r.Action))
		if !bytes.Equal(r.PrevHash, prev) {
			t.Errorf("record %d: prev hash %q, want %q", r.Seq, r.PrevHash, prev)
		}
		prev = r.Hash
	}
	if fmt.Sprint(got) != "[1:test.a 2:test.c 3:test.d]" {
		t.Errorf("chain %v, want [1:test.a 2:test.c 3:test.d]", got)
	}
	var steps []int64
	rows, err := s.r.QueryContext(ctx, `SELECT seq FROM audit_clock_steps ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	if steps, err = collect(rows, "steps", func(r scanner) (seq int64, err error) { return seq, r.Scan(&seq) }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(steps) != "[3]" {
		t.Errorf("clock steps %v, want [3]", steps)
	}
}
