package sqlite

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

// randomChain appends n records to s in one write, their times a random
// walk that mostly moves forward or stays, and sometimes steps back (a
// wall clock set back), their actions from a few.
func randomChain(t *testing.T, s *SQLite, rng *rand.Rand, n int, start time.Time) {
	t.Helper()
	actions := []string{"node.join", "node.renew", "token.create", "lock.create", "authority.start"}
	at := start
	err := s.write(t.Context(), func(ctx context.Context, tx *writeTx) error {
		for range n {
			switch r := rng.IntN(20); {
			case r == 0:
				at = at.Add(-time.Duration(rng.IntN(100)) * time.Second) // the clock stepped back
			case r < 6:
				// the same microsecond as the record before
			default:
				at = at.Add(time.Duration(rng.IntN(3_000_000)) * time.Microsecond)
			}
			action := actions[rng.IntN(len(actions))]
			if _, err := appendAudit(ctx, tx, func(head store.AuditHead) (store.AuditRecord, error) {
				seq := head.Seq + 1
				h := sha256.New()
				h.Write(head.Hash)
				binary.Write(h, binary.BigEndian, seq)
				return store.AuditRecord{Seq: seq, Time: at, Actor: "a", Action: action, Target: "t",
					Result: "ok", PrevHash: head.Hash, Hash: h.Sum(nil)}, nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// walkAudit is ListAudit as the chain walk from record 1 selects, the
// reference the seq bound must agree with: every record of all in order,
// filtered one by one.
func walkAudit(all []store.AuditRecord, f store.AuditFilter) []store.AuditRecord {
	var out []store.AuditRecord
	for _, r := range all {
		if len(out) == f.Limit {
			break
		}
		if !f.Since.IsZero() && r.Time.Before(f.Since) || r.Seq <= f.AfterSeq {
			continue
		}
		if prefix, ok := strings.CutSuffix(f.Action, "*"); ok {
			if !strings.HasPrefix(r.Action, prefix) {
				continue
			}
		} else if f.Action != "" && r.Action != f.Action {
			continue
		}
		out = append(out, r)
	}
	return out
}

// checkSinceAgainstWalk compares ListAudit with a time bound against the
// walk for since values around every record's time and before and after
// the chain (a sample of them on a long chain), with and without an action, a seq bound and a small limit.
func checkSinceAgainstWalk(t *testing.T, s *SQLite, rng *rand.Rand) {
	t.Helper()
	ctx := t.Context()
	all, err := s.ListAudit(ctx, store.AuditFilter{Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sinces := []time.Time{time.Unix(1, 0)}
	for _, r := range all {
		sinces = append(sinces, r.Time, r.Time.Add(time.Microsecond), r.Time.Add(-time.Microsecond))
	}
	if len(all) > 0 {
		sinces = append(sinces, all[len(all)-1].Time.Add(time.Hour))
	}
	// Every record's neighbourhood on a short chain, a sample on a long
	// one (each answer is a query, slow under -race).
	if len(sinces) > 80 {
		rng.Shuffle(len(sinces), func(i, j int) { sinces[i], sinces[j] = sinces[j], sinces[i] })
		sinces = sinces[:80]
	}
	for _, since := range sinces {
		f := store.AuditFilter{Since: since, Limit: 1 << 20}
		switch rng.IntN(4) {
		case 0:
			f.Action = "node.join"
		case 1:
			f.Action = "node.*"
		}
		if rng.IntN(3) == 0 && len(all) > 0 {
			f.AfterSeq = rng.Int64N(int64(len(all)))
		}
		if rng.IntN(3) == 0 {
			f.Limit = 1 + rng.IntN(5)
		}
		got, err := s.ListAudit(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		// Records of one chain are equal when their seqs are; go-cmp on
		// every answer would cost most of the test.
		if want := walkAudit(all, f); !slices.Equal(seqs(want), seqs(got)) {
			t.Fatalf("ListAudit(since %v, action %q, after %d, limit %d) selects seqs %v, the walk %v",
				since.Format(time.RFC3339Nano), f.Action, f.AfterSeq, f.Limit, seqs(got), seqs(want))
		}
		if len(got) > 0 {
			if diff := cmp.Diff(all[got[0].Seq-1], got[0]); diff != "" {
				t.Fatalf("ListAudit's first record differs from the walk's (-walk +got):\n%s", diff)
			}
		}
	}
}

// TestListAuditSinceMatchesTheWalk: ListAudit bounded by time finds its
// first record by a binary search on seq within the runs of non-decreasing
// times, and selects what walking the chain from record 1 selected, on
// random chains with equal times and clocks set back.
func TestListAuditSinceMatchesTheWalk(t *testing.T) {
	t.Parallel()
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 23))
			s, _ := openTemp(t)
			n := []int{0, 1, 2, 3}[seed%4] + int(seed/4)*rng.IntN(150)
			randomChain(t, s, rng, n, time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC))
			checkSinceAgainstWalk(t, s, rng)
			// Appended later, after the search's tables were read once.
			randomChain(t, s, rng, rng.IntN(40), time.Date(2026, 11, 27, 6, 59, 0, 0, time.UTC))
			checkSinceAgainstWalk(t, s, rng)
		})
	}
}

// TestAuditClockStepsRecorded: an append whose time is before the head's
// is listed as a step, one at or after it is not.
func TestAuditClockStepsRecorded(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t)
	base := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	for _, off := range []time.Duration{0, time.Second, time.Second, -time.Minute, 0, -time.Microsecond, time.Hour} {
		at := base.Add(off)
		if _, err := s.AppendAudit(t.Context(), func(head store.AuditHead) (store.AuditRecord, error) {
			return store.AuditRecord{Seq: head.Seq + 1, Time: at, Action: "x", Result: "ok",
				PrevHash: head.Hash, Hash: fmt.Appendf(nil, "h%d", head.Seq+1)}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := clockSteps(t, s), []int64{4, 6}; !slices.Equal(got, want) {
		t.Errorf("clock steps %v, want %v", got, want)
	}
}

func seqs(rs []store.AuditRecord) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.Seq
	}
	return out
}

func clockSteps(t *testing.T, s *SQLite) []int64 {
	t.Helper()
	rows, err := s.r.QueryContext(t.Context(), `SELECT seq FROM audit_clock_steps ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return seqs
}

// TestMigration0021FindsClockSteps: a chain written before migration 0021,
// its clock set back in places, has its steps listed by the migration, and
// ListAudit bounded by time selects on it what the walk selects.
// Not parallel: it narrows the package's migrations while the old store
// is made.
func TestMigration0021FindsClockSteps(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "muster.db")
	old := openBefore(t, path, 21)
	base := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	for seq, off := range []time.Duration{0, 2, 1, 1, 5, 3, 4, 9} {
		// Written as the old binary wrote them: no step is recorded.
		if _, err := old.w.ExecContext(ctx, `INSERT INTO audit_records (`+auditColumns+`)
			VALUES (?, ?, 'a', 'x', 't', 'ok', '', '', '', NULL, x'00')`,
			seq+1, timeArg(base.Add(off*time.Second))); err != nil {
			t.Fatal(err)
		}
	}
	closeOld(t, old)
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := clockSteps(t, s), []int64{3, 6}; !slices.Equal(got, want) {
		t.Errorf("clock steps after migration %v, want %v", got, want)
	}
	checkSinceAgainstWalk(t, s, rand.New(rand.NewPCG(21, 21)))
}

// TestAuditHeadGuessedAcrossTransactions: a transaction's first append
// builds on the head the last transaction left, unread, and inserts only
// if it is still the head. Another handle on the file (another process)
// appending in between makes the guess stale: the record is built again
// on the head read in the transaction, and its clock step judged against
// that head's time, not the guess's. The chain comes out whole.
func TestAuditHeadGuessedAcrossTransactions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a, path := openTemp(t)
	b, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	base := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	var heads []int64 // the heads passed to build, by seq
	appendAt := func(s *SQLite, off time.Duration) {
		t.Helper()
		if _, err := s.AppendAudit(ctx, func(head store.AuditHead) (store.AuditRecord, error) {
			heads = append(heads, head.Seq)
			return store.AuditRecord{Seq: head.Seq + 1, Time: base.Add(off), Action: "x", Result: "ok",
				PrevHash: head.Hash, Hash: fmt.Appendf(nil, "h%d-%d", head.Seq+1, off)}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	appendAt(a, 0)              // 1: a reads the (empty) head
	appendAt(a, time.Second)    // 2: on a's guess, right
	appendAt(b, 10*time.Second) // 3: b reads the head
	appendAt(b, 11*time.Second) // 4: on b's guess, right
	appendAt(a, 5*time.Second)  // 5: a's guess (2) is stale; built again on 4, earlier than it
	appendAt(a, 6*time.Second)  // 6: on a's guess, right again
	if want := []int64{0, 1, 2, 3, 2, 4, 5}; !slices.Equal(heads, want) {
		t.Errorf("heads built on %v, want %v", heads, want)
	}
	recs, err := a.ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var prev []byte
	for i, r := range recs {
		if r.Seq != int64(i+1) || !bytes.Equal(r.PrevHash, prev) {
			t.Fatalf("record %d: Seq %d, PrevHash %q; want Seq %d, PrevHash %q", i, r.Seq, r.PrevHash, i+1, prev)
		}
		prev = r.Hash
	}
	if len(recs) != 6 {
		t.Fatalf("chain has %d records, want 6", len(recs))
	}
	// Record 5 (5 s) follows record 4 (11 s): a step back, which the
	// guess's time (record 2's, 1 s) would have missed.
	if got, want := clockSteps(t, a), []int64{5}; !slices.Equal(got, want) {
		t.Errorf("clock steps %v, want %v", got, want)
	}
}
