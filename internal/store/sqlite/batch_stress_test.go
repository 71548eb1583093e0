package sqlite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stressOutcome is what one write's caller heard.
type stressOutcome struct {
	id       string
	alone    bool
	err      error
	panicked any
	runs     int32
	// seenTxs is every transaction its fn ran in.
	seenTxs []*writeTx
}

// TestBatchStress runs many writers against the group commit with random
// contexts (some ended before, some while queued or running), fns that
// fail, panic (always or only on their first run) or stall, writes alone
// mixed in, and in half the rounds a Close at a random moment. Every
// caller must hear once, in bounded time; a caller that heard success
// must find its row committed (read at once through the read pool, and
// after reopening); one that heard anything else must not; a write alone
// runs once at most and alone in its transaction; no transaction runs
// more than maxBatch writes.
//
// The seed is fixed, so CI runs the same random choices each time (the
// goroutines' interleaving still varies); MUSTER_MODEL_SEED=N tries another.
func TestBatchStress(t *testing.T) {
	seed := uint64(20261127)
	if v := os.Getenv("MUSTER_MODEL_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = n
	}
	t.Logf("seed %d (MUSTER_MODEL_SEED)", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>7))
	path := filepath.Join(t.TempDir(), "muster.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(t.Context(), `CREATE TABLE batch_rows (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	closeAt := time.Duration(-1)
	if rng.IntN(2) == 0 {
		closeAt = time.Duration(rng.IntN(500_000)) * time.Microsecond
	}

	const writers, perWriter = 24, 25
	var (
		mu    sync.Mutex
		txOps = map[*writeTx]map[string]bool{}
		outs  []*stressOutcome
	)
	type plan struct {
		alone       bool
		ctxKind     int // 0 background, 1 ended before, 2 ends at a random moment
		cancelAfter time.Duration
		failKind    int // 0 none, 1 error always, 2 error first run, 3 panic always, 4 panic first run
		stall       bool
	}
	plans := make([][]plan, writers)
	for w := range plans {
		for range perWriter {
			p := plan{alone: rng.IntN(6) == 0, ctxKind: rng.IntN(3), stall: rng.IntN(10) == 0}
			p.cancelAfter = time.Duration(rng.IntN(15_000)) * time.Microsecond
			if rng.IntN(4) == 0 {
				p.failKind = 1 + rng.IntN(4)
			}
			plans[w] = append(plans[w], p)
		}
	}

	var wg sync.WaitGroup
	var closed atomic.Bool // Close was called
	start := make(chan struct{})
	closeDone := make(chan error, 1)
	if closeAt >= 0 {
		go func() {
			<-start
			time.Sleep(closeAt)
			closed.Store(true) // from now the read pool may be closed
			err := s.Close()
			closeDone <- err
		}()
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i, p := range plans[w] {
				o := &stressOutcome{id: fmt.Sprintf("w%02d-%03d", w, i), alone: p.alone}
				mu.Lock()
				outs = append(outs, o)
				mu.Unlock()
				ctx, cancel := context.WithCancel(context.Background())
				switch p.ctxKind {
				case 1:
					cancel()
				case 2:
					timer := time.AfterFunc(p.cancelAfter, cancel)
					defer timer.Stop()
				}
				fn := func(ctx context.Context, tx *writeTx) error {
					n := atomic.AddInt32(&o.runs, 1)
					mu.Lock()
					o.seenTxs = append(o.seenTxs, tx)
					if txOps[tx] == nil {
						txOps[tx] = map[string]bool{}
					}
					txOps[tx][o.id] = true
					mu.Unlock()
					if p.stall {
						time.Sleep(200 * time.Microsecond)
					}
					if _, err := tx.ExecContext(ctx, `INSERT INTO batch_rows (id) VALUES (?)`, o.id); err != nil {
						return err
					}
					switch {
					case p.failKind == 1, p.failKind == 2 && n == 1:
						return errors.New("fn failed " + o.id)
					case p.failKind == 3, p.failKind == 4 && n == 1:
						panic("fn panicked " + o.id)
					}
					return nil
				}
				func() {
					defer func() { o.panicked = panicValue(recover()) }()
					if p.alone {
						o.err = s.writeAlone(ctx, fn)
					} else {
						o.err = s.write(ctx, fn)
					}
				}()
				cancel()
				if o.err == nil && o.panicked == nil && !closed.Load() {
					// Committed before its caller heard: visible now.
					var id string
					err := s.r.QueryRowContext(context.Background(), `SELECT id FROM batch_rows WHERE id = ?`, o.id).Scan(&id)
					if err != nil && !closed.Load() { // the read pool was open throughout
						t.Errorf("%s heard success but reading it: %v", o.id, err)
					}
				}
			}
		}()
	}
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	close(start)
	select {
	case <-allDone:
	case <-time.After(60 * time.Second):
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("writers hang (lost leader?)\n%s", buf[:n])
	}
	if closeAt >= 0 {
		select {
		case err := <-closeDone:
			if err != nil {
				t.Fatalf("Close: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("Close hangs")
		}
		if err := s.write(context.Background(), func(context.Context, *writeTx) error { return nil }); !errors.Is(err, errClosed) {
			t.Fatalf("write after Close: %v", err)
		}
	} else {
		s.writeMu.Lock()
		leading, queued := s.leading, len(s.queue)
		s.writeMu.Unlock()
		if leading || queued != 0 {
			t.Fatalf("idle writer: leading %v, %d queued", leading, queued)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}

	s, err = Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows := map[string]bool{}
	for _, id := range batchRows(t, s) {
		rows[id] = true
	}
	succeeded := 0
	for _, o := range outs {
		ok := o.err == nil && o.panicked == nil
		if ok {
			succeeded++
		}
		if ok != rows[o.id] {
			t.Errorf("%s: heard err %v panic %v, row committed %v", o.id, o.err, o.panicked, rows[o.id])
		}
		if o.panicked != nil && o.panicked != "fn panicked "+o.id {
			t.Errorf("%s: panicked with %v", o.id, o.panicked)
		}
		if o.panicked != nil && o.err != nil {
			t.Errorf("%s: both panicked and returned", o.id)
		}
		if o.alone {
			if o.runs > 1 {
				t.Errorf("%s: a write alone ran %d times", o.id, o.runs)
			}
			for _, tx := range o.seenTxs {
				if len(txOps[tx]) != 1 {
					t.Errorf("%s: a write alone shared its transaction with %d writes", o.id, len(txOps[tx])-1)
				}
			}
		}
	}
	for _, ops := range txOps {
		if len(ops) > maxBatch {
			t.Errorf("a transaction ran %d writes, over maxBatch", len(ops))
		}
	}
	t.Logf("%d writes, %d succeeded, %d transactions, close at %v", len(outs), succeeded, len(txOps), closeAt)
}
