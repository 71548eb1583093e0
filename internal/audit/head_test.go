package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// TestHeadFileCatchesACutTail: records removed from the tail after the
// last checkpoint (a crash, then an attacker with the store) are reported
// by Verify and refused by CheckHead; an intact chain passes both, also
// when it grew past the file, and a replaced tail is caught too.
func TestHeadFileCatchesACutTail(t *testing.T) {
	dir := t.TempDir()
	m := &memStore{}
	l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey,
		CheckpointFile: filepath.Join(dir, "cp.json"), HeadFile: filepath.Join(dir, "head")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	record := func(n int) {
		for i := 0; i < n; i++ {
			if _, err := l.Record(ctx, Event{Actor: "a", Action: "x", Result: ResultOK}); err != nil {
				t.Fatal(err)
			}
		}
	}
	record(3)
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	record(3) // records 4-6, after the checkpoint
	if rep, err := l.Verify(ctx); err != nil || !rep.OK {
		t.Fatalf("intact chain: %+v, %v", rep, err)
	}
	if err := l.CheckHead(ctx); err != nil {
		t.Fatalf("CheckHead on an intact chain: %v", err)
	}
	if h, err := ReadHeadFile(filepath.Join(dir, "head")); err != nil || h.Seq != 6 {
		t.Fatalf("head file: %+v, %v", h, err)
	}

	saved := m.recs
	m.recs = m.recs[:4] // records 5 and 6 removed
	rep, err := l.Verify(ctx)
	if err != nil || rep.OK || rep.FirstBadSeq != 5 || !strings.Contains(rep.Problem, "records 5 to 6 were removed") {
		t.Fatalf("cut tail: %+v, %v", rep, err)
	}
	if err := l.CheckHead(ctx); !errors.Is(err, ErrShortChain) {
		t.Fatalf("CheckHead on a cut tail: %v, want ErrShortChain", err)
	}

	// The same length, another record 6: replaced, not cut.
	m.recs = append(saved[:5:5], saved[5])
	m.recs[5].Hash = []byte("not the hash")
	if rep, _ := l.Verify(ctx); rep.OK {
		t.Fatal("a replaced tail verified")
	}
	if err := l.CheckHead(ctx); !errors.Is(err, ErrShortChain) {
		t.Fatalf("CheckHead on a replaced tail: %v", err)
	}

	// A damaged file is reported, never trusted.
	m.recs = saved
	os.WriteFile(filepath.Join(dir, "head"), []byte("garbage"), 0o600)
	if rep, _ := l.Verify(ctx); rep.OK || !strings.Contains(rep.Problem, "damaged") {
		t.Fatalf("damaged head file: %+v", rep)
	}
}

func FuzzParseHead(f *testing.F) {
	f.Add([]byte("12 " + strings.Repeat("ab", 32) + "   \n"))
	f.Add([]byte("0 00"))
	f.Add([]byte("-1 zz"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := parseHead(data)
		if err != nil {
			return
		}
		if h.Seq <= 0 || len(h.Hash) == 0 {
			t.Fatalf("parseHead(%q) = %+v", data, h)
		}
	})
}

// FuzzReadCheckpointFile: audit-checkpoint.json, damaged or edited. What
// it reads writes back to the same checkpoint.
func FuzzReadCheckpointFile(f *testing.F) {
	f.Add([]byte(`{"seq": 3, "hash": "00ff", "time": "2026-01-02T03:04:05.123456Z", "key_id": "k", "signature": "AAEC"}`))
	f.Add([]byte(`{"seq": -1}`))
	f.Add([]byte(`{"seq": 1, "hash": "zz"}`))
	f.Add([]byte(`{"seq": 1, "hash": "00", "time": "not a time", "signature": "!!"}`))
	path := filepath.Join(f.TempDir(), "cp.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := ReadCheckpointFile(path)
		if err != nil {
			return
		}
		if c.Seq <= 0 || len(c.Hash) == 0 || len(c.Signature) == 0 {
			t.Fatalf("accepted an incomplete checkpoint %+v", c)
		}
		if err := writeCheckpointFile(path, c); err != nil {
			t.Fatal(err)
		}
		back, err := ReadCheckpointFile(path)
		if err != nil || back.Seq != c.Seq || !back.Time.Equal(c.Time) || string(back.Hash) != string(c.Hash) ||
			string(back.Signature) != string(c.Signature) || back.KeyID != c.KeyID {
			t.Fatalf("checkpoint changed in a round trip: %+v, then %+v (%v)", c, back, err)
		}
	})
}

// countingStore counts head reads.
type countingStore struct {
	*memStore
	headReads int
}

func (c *countingStore) AuditHead(ctx context.Context) (store.AuditHead, error) {
	c.headReads++
	return c.memStore.AuditHead(ctx)
}

// TestLinkNotesTheCommittedRecord: a record written by another store write
// (a join, a renewal) through Builder is noted in the head file once the
// write commits, from the record the link built last — the one in the
// chain, also when a batch built it twice — without reading the head back
// from the store; a link the write never built (a repeated join) notes
// nothing.
func TestLinkNotesTheCommittedRecord(t *testing.T) {
	dir := t.TempDir()
	m := &countingStore{memStore: &memStore{}}
	var appended []string
	l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey,
		CheckpointFile: filepath.Join(dir, "cp.json"), HeadFile: filepath.Join(dir, "head"),
		OnAppend: func(e Event) { appended = append(appended, e.Action) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := l.Record(ctx, Event{Actor: "a", Action: "first", Result: ResultOK}); err != nil {
		t.Fatal(err)
	}
	link, err := l.Builder(Event{Actor: "a", Action: "join", Result: ResultOK})
	if err != nil {
		t.Fatal(err)
	}
	// A batch that built the record and rolled back, then the write
	// that committed it after another record took seq 2.
	head, _ := m.memStore.AuditHead(ctx)
	if _, err := link.Build(head); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Record(ctx, Event{Actor: "a", Action: "between", Result: ResultOK}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.AppendAudit(ctx, link.Build); err != nil {
		t.Fatal(err)
	}
	reads := m.headReads
	l.Appended(link)
	if m.headReads != reads {
		t.Errorf("Appended read the head %d times", m.headReads-reads)
	}
	got, err := ReadHeadFile(filepath.Join(dir, "head"))
	want := m.recs[len(m.recs)-1]
	if err != nil || got.Seq != 3 || !bytes.Equal(got.Hash, want.Hash) {
		t.Fatalf("head file %+v, %v; want seq 3 and the chain's hash", got, err)
	}
	if rep, err := l.Verify(ctx); err != nil || !rep.OK {
		t.Fatalf("chain: %+v, %v", rep, err)
	}

	unbuilt, _ := l.Builder(Event{Actor: "a", Action: "repeat", Result: ResultOK})
	l.Appended(unbuilt)
	if got, _ := ReadHeadFile(filepath.Join(dir, "head")); got.Seq != 3 {
		t.Fatalf("an unbuilt link moved the head file to %d", got.Seq)
	}
	if strings.Join(appended, ",") != "first,between,join" {
		t.Errorf("appends reported: %v", appended)
	}
}

// TestHeadFileNotesABatchOnce: appends noted while the file is being
// written are written once, as the newest of them, and none of the notes
// returns before the file holds its record or a newer one.
func TestHeadFileNotesABatchOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "head")
	h := &headFile{path: path}
	if err := h.note(1, []byte{1}); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock() // a write in progress
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			seq := int64(2 + i)
			if err := h.note(seq, []byte{byte(seq)}); err != nil {
				t.Error(err)
			}
			if got, err := ReadHeadFile(path); err != nil || got.Seq < seq {
				t.Errorf("note %d returned with the file at %+v, %v", seq, got, err)
			}
		})
	}
	for {
		h.newest.Lock()
		all := h.newest.notes == n+1
		h.newest.Unlock()
		if all {
			break
		}
		runtime.Gosched()
	}
	h.mu.Unlock()
	wg.Wait()
	got, err := ReadHeadFile(path)
	if err != nil || got.Seq != n+1 || !bytes.Equal(got.Hash, []byte{n + 1}) {
		t.Fatalf("head file %+v, %v; want %d", got, err, n+1)
	}
	if h.writes != 2 {
		t.Fatalf("the file was written %d times, want 2: the first note, then the batch's newest", h.writes)
	}
}

// TestDamagedHeadFileWayOut: a head file that does not parse is refused
// at CheckHead as damaged (not as records removed), saying what it holds
// and naming the walk of the chain and the file's removal; Verify, having
// walked the chain, names the removal; pasted, the removal lets the
// logger append again, and the next append writes the file anew.
func TestDamagedHeadFileWayOut(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data dir")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	head := filepath.Join(dir, "audit-head")
	m := &memStore{}
	l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey,
		CheckpointFile: filepath.Join(dir, "cp.json"), HeadFile: head})
	if err != nil {
		t.Fatal(err)
	}
	l.SetVerifyCommand("muster audit verify --offline --data '" + dir + "'")
	ctx := t.Context()
	for range 3 {
		if _, err := l.Record(ctx, Event{Actor: "a", Action: "x", Result: ResultOK}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ content, says string }{
		{"garbage", `it holds "garbage", not a record's SEQ HASH`},
		{"x3 abcd", `whose SEQ "x3" is not a record's number`},
		{"3 nothex", "whose HASH is not a record's hash in hex"},
	} {
		if err := os.WriteFile(head, []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		rm := "rm '" + head + "'"
		err := l.CheckHead(ctx)
		if !errors.Is(err, ErrDamagedHead) || errors.Is(err, ErrShortChain) {
			t.Fatalf("%q: CheckHead: %v, want ErrDamagedHead", c.content, err)
		}
		for _, want := range []string{head + " is damaged", c.says, "walk the chain with muster audit verify --offline --data '" + dir + "'", rm} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q: CheckHead's refusal lacks %q:\n%v", c.content, want, err)
			}
		}
		rep, err := l.Verify(ctx)
		if err != nil || rep.OK || rep.RecordsChecked != 3 || !strings.Contains(rep.Problem, "the chain is whole to record 3, but no signed checkpoint covers it yet") ||
			!strings.Contains(rep.Problem, c.says) || !strings.Contains(rep.Problem, rm) {
			t.Errorf("%q: Verify: %+v, %v", c.content, rep, err)
		}
	}
	if out, err := exec.Command("sh", "-c", "rm '"+head+"'").CombinedOutput(); err != nil {
		t.Fatalf("the pasted removal: %v %s", err, out)
	}
	// The authority started again: a new process, a new logger.
	l, err = New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey,
		CheckpointFile: filepath.Join(dir, "cp.json"), HeadFile: head})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.CheckHead(ctx); err != nil {
		t.Fatalf("CheckHead once the file is removed: %v", err)
	}
	if _, err := l.Record(ctx, Event{Actor: "a", Action: "x", Result: ResultOK}); err != nil {
		t.Fatal(err)
	}
	if h, err := ReadHeadFile(head); err != nil || h.Seq != 4 {
		t.Fatalf("the head file after the next append: %+v, %v", h, err)
	}
	if rep, err := l.Verify(ctx); err != nil || !rep.OK {
		t.Fatalf("Verify after: %+v, %v", rep, err)
	}
}

// TestDamagedHeadVerifyClaimsOnlyWhatItChecked: with the head file
// damaged, records cut from the chain's tail after the newest checkpoint
// leave nothing to find them; Verify says how far the chain is whole and
// how far a checkpoint covers it, not that every record is in place.
func TestDamagedHeadVerifyClaimsOnlyWhatItChecked(t *testing.T) {
	dir := t.TempDir()
	head := filepath.Join(dir, "audit-head")
	m := &memStore{}
	l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey,
		CheckpointFile: filepath.Join(dir, "cp.json"), HeadFile: head})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	record := func(n int) {
		for range n {
			if _, err := l.Record(ctx, Event{Actor: "a", Action: "x", Result: ResultOK}); err != nil {
				t.Fatal(err)
			}
		}
	}
	record(3)
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	record(2)
	// Record 5 cut from the tail, the head file that noted it damaged.
	m.mu.Lock()
	m.recs = m.recs[:4]
	m.mu.Unlock()
	if err := os.WriteFile(head, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := l.Verify(ctx)
	if err != nil || rep.OK {
		t.Fatalf("Verify: %+v, %v", rep, err)
	}
	if strings.Contains(rep.Problem, "every record is in place") {
		t.Errorf("Verify claims every record is in place, record 5 cut:\n%s", rep.Problem)
	}
	if !strings.Contains(rep.Problem, "the chain is whole to record 4 and a signed checkpoint covers it to record 3: records removed from its tail after 3, only this file could show") {
		t.Errorf("Verify does not say what it checked:\n%s", rep.Problem)
	}
	// A checkpoint of the newest record covers them all.
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if rep, err := l.Verify(ctx); err != nil || !strings.Contains(rep.Problem, "every record is in place (a signed checkpoint covers the newest, record 4)") {
		t.Errorf("Verify with the newest record checkpointed: %+v, %v", rep, err)
	}
}

// TestHeadFileRemovedWhileRunning: the head file removed while its logger
// runs (the damaged file's way out, pasted beside a running authority)
// is written anew at the next append, not into the removed file the
// logger held open, which left none at the path until a restart.
func TestHeadFileRemovedWhileRunning(t *testing.T) {
	dir := t.TempDir()
	head := filepath.Join(dir, "audit-head")
	l, err := New(Config{Store: &memStore{}, ChainKey: testChainKey, CheckpointKey: testSignKey,
		CheckpointFile: filepath.Join(dir, "cp.json"), HeadFile: head})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i := range 3 {
		if i == 1 {
			if err := os.Remove(head); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Record(ctx, Event{Actor: "a", Action: "x", Result: ResultOK}); err != nil {
			t.Fatal(err)
		}
		if h, err := ReadHeadFile(head); err != nil || h.Seq != int64(i+1) {
			t.Fatalf("after record %d: the head file %+v, %v", i+1, h, err)
		}
	}
}
