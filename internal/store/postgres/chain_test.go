package postgres

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// chainLogger is an audit logger on s with the keys every replica of
// one authority shares.
func chainLogger(t *testing.T, s *Store, chainKey []byte, signKey ed25519.PrivateKey) *audit.Logger {
	t.Helper()
	l, err := audit.New(audit.Config{Store: s, ChainKey: chainKey, CheckpointKey: signKey})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// chainToken is benchToken with its token.create record built by l, so
// the chain it starts verifies.
func chainToken(t *testing.T, s *Store, l *audit.Logger) {
	t.Helper()
	k, err := l.Builder(audit.Event{Actor: "admin", Action: "token.create", Target: "token t1", Result: audit.ResultOK})
	if err != nil {
		t.Fatal(err)
	}
	benchTokenWith(t, s, k.Build)
	l.Appended(k)
}

func chainKeys(t *testing.T) ([]byte, ed25519.PrivateKey) {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	_, sign, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key, sign
}

// events are the audit events the chain tests append: empty fields,
// unicode, a large reason.
func chainEvent(i int) audit.Event {
	e := audit.Event{Actor: "spiffe://muster.test/agent/" + fmt.Sprint(i), Action: "node.join", Target: fmt.Sprintf("node-%d", i),
		Result: audit.ResultOK, Source: "192.0.2.1:4242", CorrelationID: fmt.Sprintf("c-%d", i)}
	switch i % 4 {
	case 1:
		e.Actor, e.Target, e.Source, e.CorrelationID = "", "", "", ""
	case 2:
		e.Reason = "nœud « ünïcode » 节点 🚀"
	case 3:
		e.Result, e.Reason = audit.ResultDenied, strings.Repeat("a large reason ", 5000)
	}
	return e
}

func wantVerified(t *testing.T, l *audit.Logger, records int64) {
	t.Helper()
	rep, err := l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.RecordsChecked != records {
		t.Fatalf("Verify = %+v, want OK over %d records", rep, records)
	}
}

// TestChainTwoReplicasVerify: two Stores on one database (two replicas)
// append at once — joins carrying their record, plain records — each
// building on the record of its own previous append where it can; the
// chain must come out whole and pass the audit verifier.
func TestChainTwoReplicasVerify(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	key, sign := chainKeys(t)
	logs := [2]*audit.Logger{chainLogger(t, h[0], key, sign), chainLogger(t, h[1], key, sign)}
	chainToken(t, h[0], logs[0])
	const workers, each = 8, 12
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			r := w % 2
			for i := range each {
				n := w*each + i
				if i%2 == 0 {
					_, errs[w] = logs[r].Record(ctx, chainEvent(n))
				} else {
					k, err := logs[r].Builder(chainEvent(n))
					if err != nil {
						errs[w] = err
						return
					}
					j := benchJoin(int64(n))
					j.Audit = k.Build
					_, errs[w] = h[r].CommitJoin(ctx, j)
				}
				if errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if _, err := logs[1].Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	wantVerified(t, logs[0], workers*each+1)
	wantVerified(t, logs[1], workers*each+1)
}

// TestChainGuessMissed: a Store that builds its next record on the record
// of its own last append finds that another replica appended in between.
// The record is built again on the real head, the join it records still
// commits with it, and the chain verifies.
func TestChainGuessMissed(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	key, sign := chainKeys(t)
	a, b := chainLogger(t, h[0], key, sign), chainLogger(t, h[1], key, sign)
	chainToken(t, h[0], a)
	// Enough appends in a row on the chain's head for a to guess.
	for i := range ownToGuess + 1 {
		if _, err := a.Record(ctx, chainEvent(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Record(ctx, chainEvent(100)); err != nil {
		t.Fatal(err)
	}
	k, err := a.Builder(chainEvent(104))
	if err != nil {
		t.Fatal(err)
	}
	var heads []int64
	j := benchJoin(1)
	j.Audit = func(head store.AuditHead) (store.AuditRecord, error) {
		heads = append(heads, head.Seq)
		return k.Build(head)
	}
	if _, err := h[0].CommitJoin(ctx, j); err != nil {
		t.Fatal(err)
	}
	const n = ownToGuess + 2 // the token's record, then a's appends
	if fmt.Sprint(heads) != fmt.Sprint([]int64{n, n + 1}) {
		t.Errorf("the record was built on heads %v, want the guess %d, then the chain's %d", heads, n, n+1)
	}
	if _, err := h[1].GetNode(ctx, j.NodeID); err != nil {
		t.Errorf("the join did not commit: %v", err)
	}
	recs, err := h[1].ListAudit(ctx, store.AuditFilter{AfterSeq: n + 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Target != "node-104" {
		t.Fatalf("records after seq %d: %+v, want the join's", n+1, recs)
	}
	wantVerified(t, a, n+2)
	// The appends after a miss read the head under the lock for a while.
	if _, err := a.Record(ctx, chainEvent(102)); err != nil {
		t.Fatal(err)
	}
	wantVerified(t, b, n+3)
}

// TestChainWrittenBeforeVerifies: a chain written before links guessed
// their head (each record built on the head read under the chain's lock,
// inserted as that code did), then extended by this code, verifies with
// its checkpoint, and the records it already had are read back unchanged.
func TestChainWrittenBeforeVerifies(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	key, sign := chainKeys(t)
	l := chainLogger(t, s, key, sign)
	var old []store.AuditRecord
	for i := range 6 {
		k, err := l.Builder(chainEvent(i))
		if err != nil {
			t.Fatal(err)
		}
		err = s.inTx(ctx, "old append", func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, auditLockQuery, auditLockKey); err != nil {
				return err
			}
			head, err := auditHead(ctx, tx)
			if err != nil {
				return err
			}
			rec, err := store.BuildAuditRecord(head, k.Build)
			if err != nil {
				return err
			}
			old = append(old, rec)
			_, err = tx.Exec(ctx, insertAuditQuery, auditArgs(rec)...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 2 * ownToGuess {
		if _, err := l.Record(ctx, chainEvent(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	wantVerified(t, l, int64(len(old)+2*ownToGuess))
	got, err := s.ListAudit(ctx, store.AuditFilter{Limit: len(old)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range old {
		if fmt.Sprint(got[i]) != fmt.Sprint(old[i]) {
			t.Errorf("record %d read back as %+v, want %+v", i+1, got[i], old[i])
		}
	}
}

// TestChainFailedAppendsBetween: appends of one Store at once, some of
// whose records cannot be built (the link builds nothing, and the links
// after it read the head), beside a second Store appending now and then
// (guesses miss): every append that succeeded is in the chain, and the
// chain verifies.
func TestChainFailedAppendsBetween(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	key, sign := chainKeys(t)
	logs := [2]*audit.Logger{chainLogger(t, h[0], key, sign), chainLogger(t, h[1], key, sign)}
	errBuild := errors.New("no record")
	const workers, each = 12, 15
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ok    int64
		other []error
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				n := w*each + i
				var err error
				switch {
				case w == 0 && i%3 == 0:
					_, err = logs[1].Record(ctx, chainEvent(n))
				case n%5 == 0:
					_, err = h[0].AppendAudit(ctx, func(store.AuditHead) (store.AuditRecord, error) {
						return store.AuditRecord{}, errBuild
					})
					if errors.Is(err, errBuild) {
						continue
					}
					if err == nil {
						err = errors.New("a build that failed appended")
					}
				default:
					_, err = logs[0].Record(ctx, chainEvent(n))
				}
				mu.Lock()
				if err == nil {
					ok++
				} else {
					other = append(other, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(other...); err != nil {
		t.Fatal(err)
	}
	wantVerified(t, logs[1], ok)
}

// TestChainBatonsOfTwoStoresCollide: two Stores whose baton numbers would
// have been the same (counters from one start, as two replicas' random
// starts could come within the links in flight) append at once, both
// guessing; every append must end and the chain verify. With batons that
// are only unique within a Store, a link of one waited in the database
// for the other's transaction holding the same number while that one
// waited for it, through a Go-side wait PostgreSQL cannot see: a hang.
func TestChainBatonsOfTwoStoresCollide(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	key, sign := chainKeys(t)
	logs := [2]*audit.Logger{chainLogger(t, h[0], key, sign), chainLogger(t, h[1], key, sign)}
	const workers, each = 8, 40
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				// Both Stores guess again and again.
				for _, s := range h {
					s.chain.mu.Lock()
					s.chain.own, s.chain.quietUntil = ownToGuess, time.Time{}
					s.chain.mu.Unlock()
				}
				if _, errs[w] = logs[w%2].Record(ctx, chainEvent(w*each+i)); errs[w] != nil {
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("the appends of two Stores with the same baton numbers hang")
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	wantVerified(t, logs[0], workers*each)
}

// TestChainBatonsUniqueAcrossStores: links of two Stores under way at once
// hold different batons, whatever the Stores' own state (here both made
// to count from one number, as two replicas' counters could meet).
func TestChainBatonsUniqueAcrossStores(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	// Links that guess (a quiet one would take the chain's lock).
	for _, s := range h {
		s.chain.last, s.chain.own = &link{}, ownToGuess
	}
	var batons [2]int32
	err := h[0].inPipe(ctx, "test", func(p0 *pipe) error {
		l0 := p0.startAudit()
		defer l0.end()
		if err := p0.send(ctx); err != nil {
			return err
		}
		batons[0] = l0.baton
		// A baton that is the other's waits for it: bounded.
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return h[1].inPipe(ctx, "test", func(p1 *pipe) error {
			l1 := p1.startAudit()
			defer l1.end()
			if err := p1.send(ctx); err != nil {
				return err
			}
			batons[1] = l1.baton
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if batons[0] == batons[1] {
		t.Fatalf("two Stores' links under way at once hold the same baton %d", batons[0])
	}
}

// TestChainPredecessorWaitBounded: a link whose predecessor never builds
// its record (in Go; nothing holds its baton in the database) waits for
// it a bounded time, then reads the head, and appends.
func TestChainPredecessorWaitBounded(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	key, sign := chainKeys(t)
	l := chainLogger(t, s, key, sign)
	for i := range ownToGuess + 1 {
		if _, err := l.Record(ctx, chainEvent(i)); err != nil {
			t.Fatal(err)
		}
	}
	stuck := &link{c: s.chain, baton: 12345, ready: make(chan struct{})}
	s.chain.mu.Lock()
	s.chain.live[stuck] = struct{}{}
	s.chain.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := l.Record(ctx, chainEvent(50))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("an append waits in Go for a predecessor that never builds its record")
	}
	stuck.end()
	wantVerified(t, l, ownToGuess+2)
}

// TestChainCancelledLinkDoesNotCommit: a link whose caller gives up while
// it waits for the chain's lock fails, and its write never commits, even
// once the lock is free; the Store forgets the link.
func TestChainCancelledLinkDoesNotCommit(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	key, sign := chainKeys(t)
	l := chainLogger(t, s, key, sign)
	chainToken(t, s, l)
	for i := range ownToGuess + 1 {
		if _, err := l.Record(ctx, chainEvent(i)); err != nil {
			t.Fatal(err)
		}
	}
	holder, err := s.pool.p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, auditLockKey); err != nil {
		t.Fatal(err)
	}
	k, err := l.Builder(chainEvent(60))
	if err != nil {
		t.Fatal(err)
	}
	j := benchJoin(60)
	j.Audit = k.Build
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = s.CommitJoin(cctx, j)
	cancel()
	if err == nil {
		t.Fatal("the join committed while the chain's lock was held")
	}
	t.Log(err)
	if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	holder.Release()
	time.Sleep(2 * time.Second)
	if _, err := s.GetNode(ctx, j.NodeID); err == nil {
		t.Fatal("the join whose caller was told it failed committed later")
	}
	s.chain.mu.Lock()
	live, unplaced := len(s.chain.live), s.chain.unplaced
	s.chain.mu.Unlock()
	if live != 0 || unplaced != 0 {
		t.Fatalf("the Store keeps %d live and %d unplaced links", live, unplaced)
	}
	wantVerified(t, l, ownToGuess+2) // and the token's record
}

// TestChainGuessCheckedByHash: a Store's link builds on the record its
// predecessor published, which then rolled back, while another replica
// appended a record of the same seq: the guess has the head's seq but not
// its hash, so its insert must fail and the record be built again on the
// chain's head.
func TestChainGuessCheckedByHash(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	key, sign := chainKeys(t)
	a, b := chainLogger(t, h[0], key, sign), chainLogger(t, h[1], key, sign)
	for i := range ownToGuess + 1 {
		if _, err := a.Record(ctx, chainEvent(i)); err != nil {
			t.Fatal(err)
		}
	}
	head, err := h[0].AuditHead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k, err := a.Builder(chainEvent(70))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.BuildAuditRecord(head, k.Build)
	if err != nil {
		t.Fatal(err)
	}
	// The predecessor: placed, its record published, never inserted (its
	// transaction rolled back); nothing holds its baton.
	pred := &link{c: h[0].chain, baton: -2000000000, ready: make(chan struct{})}
	h[0].chain.mu.Lock()
	h[0].chain.live[pred] = struct{}{}
	h[0].chain.mu.Unlock()
	pred.publish(rec)
	if _, err := b.Record(ctx, chainEvent(71)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Record(ctx, chainEvent(72)); err != nil {
		t.Fatal(err)
	}
	pred.end()
	wantVerified(t, b, ownToGuess+3)
}
