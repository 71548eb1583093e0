package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

var (
	testChainKey = bytes.Repeat([]byte{7}, 32)
	testSignKey  = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, ed25519.SeedSize))
	otherSignKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{10}, ed25519.SeedSize))
)

// clock is a test clock that moves 1.5ms, plus some nanoseconds that
// records must drop, at every reading.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock {
	return &clock{t: time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.FixedZone("CET", 3600))}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(1500*time.Microsecond + 7)
	return c.t
}

// env is a logger on a real SQLite store in a temporary directory.
type env struct {
	l      *Logger
	st     *sqlite.SQLite
	dbPath string
	cpFile string
	clock  *clock
}

func newEnv(t testing.TB) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{
		dbPath: filepath.Join(dir, "muster.db"),
		cpFile: filepath.Join(dir, "audit-checkpoint.json"),
		clock:  newClock(),
	}
	st, err := sqlite.Open(context.Background(), e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.st = st
	e.l = e.logger(t)
	return e
}

// logger returns a fresh Logger on the env's store, with nothing cached.
func (e *env) logger(t testing.TB) *Logger {
	t.Helper()
	l, err := New(Config{
		Store:          e.st,
		ChainKey:       testChainKey,
		CheckpointKey:  testSignKey,
		CheckpointFile: e.cpFile,
		Now:            e.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (e *env) record(t testing.TB, n int) {
	t.Helper()
	for range n {
		if _, err := e.l.Record(context.Background(), testEvent(0)); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *env) checkpoint(t testing.TB) store.AuditCheckpoint {
	t.Helper()
	c, err := e.l.Checkpoint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) records(t testing.TB) []store.AuditRecord {
	t.Helper()
	recs, err := e.st.ListAudit(context.Background(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// tamper runs stmts on the database file the way an attacker with write
// access to it would: through its own connection, after dropping the
// append-only triggers, which are no obstacle to such an attacker.
func (e *env) tamper(t testing.TB, f func(db *sql.DB) error) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+e.dbPath+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, trg := range []string{"audit_records_no_update", "audit_records_no_delete"} {
		if _, err := db.Exec(`DROP TRIGGER IF EXISTS ` + trg); err != nil {
			t.Fatal(err)
		}
	}
	if err := f(db); err != nil {
		t.Fatalf("tamper: %v", err)
	}
}

func stmts(stmts ...string) func(*sql.DB) error {
	return func(db *sql.DB) error {
		for _, s := range stmts {
			if _, err := db.Exec(s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	}
}

// rechain rewrites every hash and prev_hash in the database with hash, as an
// attacker would to hide edits made with edit.
func (e *env) rechain(t testing.TB, hash func(store.AuditRecord) []byte, edit func(*store.AuditRecord)) {
	t.Helper()
	recs := e.records(t)
	e.tamper(t, func(db *sql.DB) error {
		var prev []byte
		for _, r := range recs {
			edit(&r)
			r.PrevHash = prev
			r.Hash = hash(r)
			prev = r.Hash
			if _, err := db.Exec(`UPDATE audit_records SET actor = ?, prev_hash = ?, hash = ? WHERE seq = ?`,
				r.Actor, r.PrevHash, r.Hash, r.Seq); err != nil {
				return err
			}
		}
		return nil
	})
}

func testEvent(i int) Event {
	return Event{
		Actor:         "spiffe://example.org/operator/alice",
		Action:        "lock.create",
		Target:        fmt.Sprintf("node/n%d", i),
		Result:        ResultOK,
		Reason:        "maintenance",
		Source:        "192.0.2.1:4433",
		CorrelationID: "3f1c8f0e-7a0b-4b4e-9a55-2f0d4b8e6a11",
	}
}

func TestVerifyCatchesTampering(t *testing.T) {
	type tc struct {
		name string
		// checkpointAt lists the chain lengths at which a checkpoint is
		// taken while the 10 records are written.
		checkpointAt []int
		tamper       func(t *testing.T, e *env)
		wantSeq      int64
		// wantProblem must appear in the problem; "" means the chain is OK.
		wantProblem string
		// wantFile says the problem names the checkpoint file.
		wantFile bool
	}
	tests := []tc{
		{
			name:         "untouched",
			checkpointAt: []int{5, 10},
			tamper:       func(*testing.T, *env) {},
		},
		{
			name: "field edited",
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(`UPDATE audit_records SET actor = 'mallory' WHERE seq = 4`))
			},
			wantSeq: 4, wantProblem: "record 4 was edited: its hash does not match its contents",
		},
		{
			name: "time edited",
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(`UPDATE audit_records SET time = time - 3600000000 WHERE seq = 7`))
			},
			wantSeq: 7, wantProblem: "record 7 was edited",
		},
		{
			name:         "result edited past a checkpoint",
			checkpointAt: []int{5},
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(`UPDATE audit_records SET result = 'ok', reason = '' WHERE seq = 7`))
			},
			wantSeq: 7, wantProblem: "record 7 was edited",
		},
		{
			name: "hash replaced",
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(`UPDATE audit_records SET hash = randomblob(32) WHERE seq = 6`))
			},
			wantSeq: 6, wantProblem: "record 6 was edited",
		},
		{
			name:    "middle record deleted",
			tamper:  func(t *testing.T, e *env) { e.tamper(t, stmts(`DELETE FROM audit_records WHERE seq = 5`)) },
			wantSeq: 5, wantProblem: "record 5 is missing (removed)",
		},
		{
			name:    "two records deleted",
			tamper:  func(t *testing.T, e *env) { e.tamper(t, stmts(`DELETE FROM audit_records WHERE seq IN (3, 4)`)) },
			wantSeq: 3, wantProblem: "records 3 to 4 are missing (removed)",
		},
		{
			name:    "first record deleted",
			tamper:  func(t *testing.T, e *env) { e.tamper(t, stmts(`DELETE FROM audit_records WHERE seq = 1`)) },
			wantSeq: 1, wantProblem: "record 1 is missing (removed)",
		},
		{
			name: "first record deleted and the rest renumbered",
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(
					`DELETE FROM audit_records WHERE seq = 1`,
					`UPDATE audit_records SET seq = seq + 1000`,
					`UPDATE audit_records SET seq = seq - 1001`,
				))
			},
			wantSeq: 1, wantProblem: "record 1 does not start the chain",
		},
		{
			name: "record inserted and the rest renumbered",
			tamper: func(t *testing.T, e *env) {
				prev := e.records(t)[2].Hash
				e.tamper(t, func(db *sql.DB) error {
					if err := stmts(
						`UPDATE audit_records SET seq = seq + 1000 WHERE seq >= 4`,
						`UPDATE audit_records SET seq = seq - 999 WHERE seq > 1000`,
					)(db); err != nil {
						return err
					}
					fake := sha256.Sum256([]byte("looks like a hash"))
					_, err := db.Exec(`INSERT INTO audit_records SELECT 4, time, 'alice', 'lock.delete', 'node/n1', 'ok', '', '', '', ?, ?
						FROM audit_records WHERE seq = 3`, prev, fake[:])
					return err
				})
			},
			wantSeq: 4, wantProblem: "record 4 was edited",
		},
		{
			name: "record forged at the head",
			tamper: func(t *testing.T, e *env) {
				prev := e.records(t)[9].Hash
				e.tamper(t, func(db *sql.DB) error {
					fake := sha256.Sum256([]byte("looks like a hash"))
					_, err := db.Exec(`INSERT INTO audit_records SELECT 11, time, 'alice', 'lock.delete', 'node/n1', 'ok', '', '', '', ?, ?
						FROM audit_records WHERE seq = 10`, prev, fake[:])
					return err
				})
			},
			wantSeq: 11, wantProblem: "record 11 was edited",
		},
		{
			name: "records swapped",
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(
					`UPDATE audit_records SET seq = 1003 WHERE seq = 3`,
					`UPDATE audit_records SET seq = 3 WHERE seq = 4`,
					`UPDATE audit_records SET seq = 4 WHERE seq = 1003`,
				))
			},
			wantSeq: 3, wantProblem: "record 3 does not link to record 2 (inserted or reordered)",
		},
		{
			name:         "chain rebuilt under another key",
			checkpointAt: []int{10},
			tamper: func(t *testing.T, e *env) {
				key := bytes.Repeat([]byte{8}, 32)
				e.rechain(t, func(r store.AuditRecord) []byte { return ChainHash(key, r) }, func(r *store.AuditRecord) {
					if r.Seq == 6 {
						r.Actor = "mallory"
					}
				})
			},
			wantSeq: 1, wantProblem: "record 1 was edited",
		},
		{
			name: "chain rebuilt with plain SHA-256",
			tamper: func(t *testing.T, e *env) {
				e.rechain(t, func(r store.AuditRecord) []byte {
					sum := sha256.Sum256(fmt.Appendf(nil, "%d|%d|%s|%s|%s|%s|%s|%s|%s|%x", r.Seq, r.Time.UnixMicro(),
						r.Actor, r.Action, r.Target, r.Result, r.Reason, r.Source, r.CorrelationID, r.PrevHash))
					return sum[:]
				}, func(r *store.AuditRecord) {
					if r.Seq == 9 {
						r.Actor = "mallory"
					}
				})
			},
			wantSeq: 1, wantProblem: "record 1 was edited",
		},
		{
			name:         "tail deleted after a checkpoint",
			checkpointAt: []int{10},
			tamper:       func(t *testing.T, e *env) { e.tamper(t, stmts(`DELETE FROM audit_records WHERE seq >= 8`)) },
			wantSeq:      8, wantProblem: "the chain ends at record 7 but a checkpoint covers record 10 (records removed from the tail)",
		},
		{
			name:         "tail and store checkpoints deleted",
			checkpointAt: []int{5, 10},
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(`DELETE FROM audit_records WHERE seq >= 8`, `DELETE FROM audit_checkpoints`))
			},
			wantSeq: 8, wantProblem: "the chain ends at record 7 but the checkpoint in", wantFile: true,
		},
		{
			name:         "tail deleted and regrown",
			checkpointAt: []int{10},
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(`DELETE FROM audit_records WHERE seq >= 8`, `DELETE FROM audit_checkpoints`))
				e.record(t, 4) // the authority goes on appending to the cut chain
			},
			wantSeq: 10, wantProblem: "record 10 differs from the checkpoint signed at", wantFile: true,
		},
		{
			name:         "checkpoint signature forged",
			checkpointAt: []int{5, 10},
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(`UPDATE audit_checkpoints SET signature = randomblob(64) WHERE seq = 10`))
			},
			wantSeq: 10, wantProblem: "checkpoint at seq 10 has a bad signature",
		},
		{
			name:         "checkpoint hash changed",
			checkpointAt: []int{5},
			tamper: func(t *testing.T, e *env) {
				e.tamper(t, stmts(`UPDATE audit_checkpoints SET hash = randomblob(32) WHERE seq = 5`))
			},
			wantSeq: 5, wantProblem: "checkpoint at seq 5 has a bad signature",
		},
		{
			name: "checkpoint signed by another key",
			tamper: func(t *testing.T, e *env) {
				head := e.records(t)[9]
				c := store.AuditCheckpoint{Seq: 12, Hash: head.Hash, Time: head.Time, KeyID: KeyID(otherSignKey.Public().(ed25519.PublicKey))}
				c.Signature = ed25519.Sign(otherSignKey, checkpointMessage(c.Seq, c.Hash, c.Time))
				if err := e.st.InsertAuditCheckpoint(context.Background(), c); err != nil {
					t.Fatal(err)
				}
			},
			wantSeq: 12, wantProblem: "checkpoint at seq 12 has a bad signature (it names key",
		},
		{
			name:         "checkpoint file forged",
			checkpointAt: []int{10},
			tamper: func(t *testing.T, e *env) {
				c, err := ReadCheckpointFile(e.cpFile)
				if err != nil {
					t.Fatal(err)
				}
				c.Signature[0] ^= 1
				if err := writeCheckpointFile(e.cpFile, c); err != nil {
					t.Fatal(err)
				}
			},
			wantSeq: 10, wantProblem: "(seq 10) has a bad signature", wantFile: true,
		},
		{
			name:         "checkpoint file damaged",
			checkpointAt: []int{10},
			tamper: func(t *testing.T, e *env) {
				if err := os.WriteFile(e.cpFile, []byte(`{"seq":10,`), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantSeq: 0, wantProblem: "is damaged", wantFile: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			for i := 1; i <= 10; i++ {
				e.record(t, 1)
				for _, at := range tt.checkpointAt {
					if at == i {
						e.checkpoint(t)
					}
				}
			}
			tt.tamper(t, e)

			rep, err := e.logger(t).Verify(context.Background())
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if tt.wantProblem == "" {
				if !rep.OK || rep.Problem != "" || rep.FirstBadSeq != 0 {
					t.Fatalf("Verify = %+v, want OK", rep)
				}
				if rep.RecordsChecked != 10 || rep.CheckpointsChecked != 3 || rep.Head.Seq != 10 {
					t.Errorf("Verify = %+v, want 10 records and 3 checkpoints (two in the store, one in the file) to head 10", rep)
				}
				return
			}
			if rep.OK {
				t.Fatalf("Verify = %+v, want a problem", rep)
			}
			if rep.FirstBadSeq != tt.wantSeq {
				t.Errorf("FirstBadSeq = %d, want %d (problem %q)", rep.FirstBadSeq, tt.wantSeq, rep.Problem)
			}
			if !strings.Contains(rep.Problem, tt.wantProblem) {
				t.Errorf("Problem = %q, want it to contain %q", rep.Problem, tt.wantProblem)
			}
			if got := strings.Contains(rep.Problem, e.cpFile); got != tt.wantFile {
				t.Errorf("Problem = %q, names the checkpoint file: %v, want %v", rep.Problem, got, tt.wantFile)
			}
			if tt.wantSeq > 0 && rep.RecordsChecked != min(tt.wantSeq-1, 10) {
				t.Errorf("RecordsChecked = %d, want %d", rep.RecordsChecked, tt.wantSeq-1)
			}
		})
	}
}

func TestVerifyEmptyChain(t *testing.T) {
	e := newEnv(t)
	rep, err := e.l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.RecordsChecked != 0 || rep.CheckpointsChecked != 0 || rep.Head.Seq != 0 || rep.Problem != "" {
		t.Errorf("Verify = %+v, want OK with nothing checked", rep)
	}
}

// TestVerifyPages checks the walk across several pages, on a store fast
// enough to hold thousands of records.
func TestVerifyPages(t *testing.T) {
	tests := []struct {
		name    string
		n       int
		tamper  func(m *memStore)
		wantSeq int64
	}{
		{name: "intact", n: 2500},
		{name: "exactly one page", n: verifyPageSize},
		{name: "edited on the second page", n: 2500, tamper: func(m *memStore) { m.recs[1500].Reason = "x" }, wantSeq: 1501},
		{name: "removed at a page boundary", n: 2500, tamper: func(m *memStore) {
			m.recs = append(m.recs[:1000:1000], m.recs[1001:]...)
		}, wantSeq: 1001},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &memStore{}
			l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey, Now: newClock().Now})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i := range tt.n {
				if _, err := l.Record(ctx, testEvent(i)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.Checkpoint(ctx); err != nil {
				t.Fatal(err)
			}
			if tt.tamper != nil {
				tt.tamper(m)
			}
			rep, err := l.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantSeq == 0 {
				if !rep.OK || rep.RecordsChecked != int64(tt.n) || rep.CheckpointsChecked != 1 || rep.Head.Seq != int64(tt.n) {
					t.Errorf("Verify = %+v, want OK over %d records and 1 checkpoint", rep, tt.n)
				}
				return
			}
			if rep.OK || rep.FirstBadSeq != tt.wantSeq {
				t.Errorf("Verify = %+v, want FirstBadSeq %d", rep, tt.wantSeq)
			}
		})
	}
}

func TestVerifyStoreFailure(t *testing.T) {
	m := &memStore{}
	l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Record(context.Background(), testEvent(0)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	m.fail(boom)
	if _, err := l.Verify(context.Background()); !errors.Is(err, boom) {
		t.Errorf("Verify error = %v, want %v", err, boom)
	}
}

func TestRecord(t *testing.T) {
	e := newEnv(t)
	var appended []Event
	l, err := New(Config{
		Store: e.st, ChainKey: testChainKey, CheckpointKey: testSignKey, Now: e.clock.Now,
		OnAppend: func(ev Event) { appended = append(appended, ev) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ev := testEvent(1)
	r1, err := l.Record(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Record(ctx, Event{Action: "authority.start", Result: ResultDenied})
	if err != nil {
		t.Fatal(err)
	}

	if r1.Seq != 1 || r2.Seq != 2 {
		t.Errorf("seqs = %d, %d, want 1, 2", r1.Seq, r2.Seq)
	}
	if len(r1.PrevHash) != 0 || !bytes.Equal(r2.PrevHash, r1.Hash) {
		t.Errorf("prev hashes = %x, %x, want none and %x", r1.PrevHash, r2.PrevHash, r1.Hash)
	}
	if r1.Time.Location() != time.UTC || r1.Time.Nanosecond()%1000 != 0 || !r2.Time.After(r1.Time) {
		t.Errorf("times = %v, %v, want increasing, UTC, whole microseconds", r1.Time, r2.Time)
	}
	got := Event{r1.Actor, r1.Action, r1.Target, r1.Result, r1.Reason, r1.Source, r1.CorrelationID}
	if got != ev {
		t.Errorf("record 1 holds %+v, want %+v", got, ev)
	}
	if !bytes.Equal(r1.Hash, ChainHash(testChainKey, r1)) {
		t.Errorf("record 1 hash is not its ChainHash")
	}
	// What the store gives back must hash the same as what Record returned.
	stored := e.records(t)
	if len(stored) != 2 || !bytes.Equal(stored[1].Hash, ChainHash(testChainKey, stored[1])) || !stored[0].Time.Equal(r1.Time) {
		t.Errorf("stored records %+v do not match the records returned", stored)
	}
	if len(appended) != 2 || appended[0] != ev {
		t.Errorf("OnAppend saw %+v, want both events", appended)
	}
}

func TestRecordRejectsInvalidEvents(t *testing.T) {
	tests := []struct {
		name string
		e    Event
	}{
		{"no action", Event{Actor: "a", Result: ResultOK}},
		{"no result", Event{Actor: "a", Action: "lock.create"}},
		{"unknown result", Event{Actor: "a", Action: "lock.create", Result: "maybe"}},
		{"result in the wrong case", Event{Actor: "a", Action: "lock.create", Result: "OK"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &memStore{}
			called := false
			l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey, OnAppend: func(Event) { called = true }})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Record(context.Background(), tt.e); !errors.Is(err, ErrInvalidEvent) {
				t.Errorf("Record error = %v, want ErrInvalidEvent", err)
			}
			if len(m.recs) != 0 || called {
				t.Errorf("an invalid event was appended")
			}
		})
	}
}

func TestRecordStoreFailure(t *testing.T) {
	m := &memStore{}
	called := false
	l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey, OnAppend: func(Event) { called = true }})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	m.fail(boom)
	if _, err := l.Record(context.Background(), testEvent(0)); !errors.Is(err, boom) {
		t.Errorf("Record error = %v, want %v", err, boom)
	}
	if called {
		t.Errorf("OnAppend was called for a failed append")
	}
}

func TestRecordConcurrent(t *testing.T) {
	e := newEnv(t)
	var appended atomic.Int64
	l, err := New(Config{Store: e.st, ChainKey: testChainKey, CheckpointKey: testSignKey,
		OnAppend: func(Event) { appended.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 20, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := l.Record(context.Background(), testEvent(w*each+i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	rep, err := l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.RecordsChecked != writers*each || rep.Head.Seq != writers*each {
		t.Errorf("Verify = %+v, want OK over %d records", rep, writers*each)
	}
	if n := appended.Load(); n != writers*each {
		t.Errorf("OnAppend called %d times, want %d", n, writers*each)
	}
	seen := map[string]bool{}
	for _, r := range e.records(t) {
		seen[r.Target] = true
	}
	if len(seen) != writers*each {
		t.Errorf("%d distinct events in the chain, want %d", len(seen), writers*each)
	}
}

func TestChainHash(t *testing.T) {
	base := store.AuditRecord{
		Seq: 3, Time: time.UnixMicro(1_700_000_000_000_001).UTC(),
		Actor: "alice", Action: "lock.create", Target: "node/n1", Result: ResultOK,
		Reason: "r", Source: "s", CorrelationID: "c", PrevHash: []byte{1, 2, 3},
	}
	want := ChainHash(testChainKey, base)
	tests := []struct {
		name string
		edit func(r *store.AuditRecord)
		key  []byte
	}{
		{name: "seq", edit: func(r *store.AuditRecord) { r.Seq++ }},
		{name: "time", edit: func(r *store.AuditRecord) { r.Time = r.Time.Add(time.Microsecond) }},
		{name: "actor", edit: func(r *store.AuditRecord) { r.Actor = "mallory" }},
		{name: "action", edit: func(r *store.AuditRecord) { r.Action = "lock.delete" }},
		{name: "target", edit: func(r *store.AuditRecord) { r.Target = "node/n2" }},
		{name: "result", edit: func(r *store.AuditRecord) { r.Result = ResultDenied }},
		{name: "reason", edit: func(r *store.AuditRecord) { r.Reason = "" }},
		{name: "source", edit: func(r *store.AuditRecord) { r.Source = "t" }},
		{name: "correlation id", edit: func(r *store.AuditRecord) { r.CorrelationID = "d" }},
		{name: "prev hash", edit: func(r *store.AuditRecord) { r.PrevHash = []byte{1, 2, 4} }},
		{name: "bytes moved between fields", edit: func(r *store.AuditRecord) { r.Actor, r.Action = "alicel", "ock.create" }},
		{name: "bytes moved into the prev hash", edit: func(r *store.AuditRecord) { r.CorrelationID, r.PrevHash = "", []byte("c\x01\x02\x03") }},
		{name: "key", edit: func(*store.AuditRecord) {}, key: bytes.Repeat([]byte{8}, 32)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := base
			tt.edit(&r)
			key := testChainKey
			if tt.key != nil {
				key = tt.key
			}
			if bytes.Equal(ChainHash(key, r), want) {
				t.Errorf("changing the %s does not change the hash", tt.name)
			}
		})
	}
	// Only the instant counts, not how it is written down.
	r := base
	r.Time = r.Time.In(time.FixedZone("X", 7200))
	r.Hash = []byte("ignored")
	if !bytes.Equal(ChainHash(testChainKey, r), want) {
		t.Errorf("the time zone or the Hash field changes the hash")
	}
}

func TestNewValidates(t *testing.T) {
	mismatched := bytes.Clone(testSignKey)
	copy(mismatched[ed25519.SeedSize:], otherSignKey.Public().(ed25519.PublicKey))
	tests := []struct {
		name    string
		edit    func(c *Config)
		wantErr string
	}{
		{name: "valid", edit: func(*Config) {}},
		{name: "no store", edit: func(c *Config) { c.Store = nil }, wantErr: "no store"},
		{name: "no chain key", edit: func(c *Config) { c.ChainKey = nil }, wantErr: "chain key is 0 bytes"},
		{name: "short chain key", edit: func(c *Config) { c.ChainKey = make([]byte, 31) }, wantErr: "chain key is 31 bytes"},
		{name: "long chain key", edit: func(c *Config) { c.ChainKey = make([]byte, 64) }},
		{name: "no checkpoint key", edit: func(c *Config) { c.CheckpointKey = nil }, wantErr: "checkpoint key is 0 bytes"},
		{name: "seed as checkpoint key", edit: func(c *Config) { c.CheckpointKey = testSignKey.Seed() }, wantErr: "checkpoint key is 32 bytes"},
		{name: "inconsistent checkpoint key", edit: func(c *Config) { c.CheckpointKey = mismatched }, wantErr: "inconsistent"},
		{name: "negative interval", edit: func(c *Config) { c.CheckpointInterval = -time.Second }, wantErr: "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Store: &memStore{}, ChainKey: testChainKey, CheckpointKey: testSignKey}
			tt.edit(&c)
			l, err := New(c)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if l.interval != time.Minute || l.now == nil {
					t.Errorf("defaults not applied: interval %v", l.interval)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewCopiesKeys(t *testing.T) {
	key := bytes.Clone(testChainKey)
	l, err := New(Config{Store: &memStore{}, ChainKey: key, CheckpointKey: testSignKey})
	if err != nil {
		t.Fatal(err)
	}
	clear(key)
	r, err := l.Record(context.Background(), testEvent(0))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Hash, ChainHash(testChainKey, r)) {
		t.Errorf("the logger uses the caller's key slice, which the caller changed")
	}
}

func TestKeyID(t *testing.T) {
	id := KeyID(testSignKey.Public().(ed25519.PublicKey))
	if !strings.HasPrefix(id, "ed25519:") || len(id) != len("ed25519:")+16 {
		t.Errorf("KeyID = %q, want ed25519: and 16 hex digits", id)
	}
	if id == KeyID(otherSignKey.Public().(ed25519.PublicKey)) {
		t.Errorf("two keys share the ID %q", id)
	}
}

func TestCheckpoint(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	// An empty chain has nothing to sign.
	if c, err := e.l.Checkpoint(ctx); err != nil || c.Seq != 0 {
		t.Fatalf("Checkpoint of an empty chain = %+v, %v; want none", c, err)
	}
	if _, err := os.Stat(e.cpFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("checkpoint file written for an empty chain: %v", err)
	}

	e.record(t, 3)
	c1 := e.checkpoint(t)
	head := e.records(t)[2]
	if c1.Seq != 3 || !bytes.Equal(c1.Hash, head.Hash) || c1.KeyID != KeyID(testSignKey.Public().(ed25519.PublicKey)) ||
		!signedBy(testSignKey.Public().(ed25519.PublicKey), c1) || c1.Time.Location() != time.UTC || c1.Time.Nanosecond()%1000 != 0 {
		t.Fatalf("Checkpoint = %+v, want a signed checkpoint of record 3 at a whole microsecond", c1)
	}

	tests := []struct {
		name    string
		logger  func() *Logger
		records int
		wantSeq int64
		wantNew bool // a new checkpoint is stored
	}{
		{name: "head not moved", logger: func() *Logger { return e.l }, wantSeq: 3},
		{name: "head not moved, fresh logger", logger: func() *Logger { return e.logger(t) }, wantSeq: 3},
		{name: "head moved", logger: func() *Logger { return e.l }, records: 2, wantSeq: 5, wantNew: true},
		{name: "head not moved again", logger: func() *Logger { return e.l }, wantSeq: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := e.st.ListAuditCheckpoints(ctx)
			if err != nil {
				t.Fatal(err)
			}
			fileBefore, err := os.ReadFile(e.cpFile)
			if err != nil {
				t.Fatal(err)
			}
			e.record(t, tt.records)
			c, err := tt.logger().Checkpoint(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if c.Seq != tt.wantSeq {
				t.Errorf("Checkpoint seq = %d, want %d", c.Seq, tt.wantSeq)
			}
			after, err := e.st.ListAuditCheckpoints(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(after) > len(before); got != tt.wantNew {
				t.Errorf("%d checkpoints before, %d after; want a new one: %v", len(before), len(after), tt.wantNew)
			}
			fileAfter, err := os.ReadFile(e.cpFile)
			if err != nil {
				t.Fatal(err)
			}
			if got := !bytes.Equal(fileBefore, fileAfter); got != tt.wantNew {
				t.Errorf("checkpoint file rewritten: %v, want %v", got, tt.wantNew)
			}
			if !tt.wantNew && !checkpointsEqual(c, before[len(before)-1]) {
				t.Errorf("no-op Checkpoint = %+v, want the last one stored %+v", c, before[len(before)-1])
			}
		})
	}
}

func checkpointsEqual(a, b store.AuditCheckpoint) bool {
	return a.Seq == b.Seq && bytes.Equal(a.Hash, b.Hash) && a.Time.Equal(b.Time) && a.KeyID == b.KeyID && bytes.Equal(a.Signature, b.Signature)
}

func TestCheckpointFile(t *testing.T) {
	e := newEnv(t)
	e.record(t, 2)
	c := e.checkpoint(t)

	fi, err := os.Stat(e.cpFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("checkpoint file mode = %v, want 0600", fi.Mode().Perm())
	}
	entries, err := os.ReadDir(filepath.Dir(e.cpFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range entries {
		if strings.HasSuffix(ent.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", ent.Name())
		}
	}

	data, err := os.ReadFile(e.cpFile)
	if err != nil {
		t.Fatal(err)
	}
	var shape map[string]any
	if err := json.Unmarshal(data, &shape); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"seq", "hash", "time", "key_id", "signature"} {
		if _, ok := shape[k]; !ok {
			t.Errorf("checkpoint file has no %q: %s", k, data)
		}
	}
	if len(shape) != 5 {
		t.Errorf("checkpoint file has %d fields, want 5: %s", len(shape), data)
	}

	got, err := ReadCheckpointFile(e.cpFile)
	if err != nil {
		t.Fatal(err)
	}
	if !checkpointsEqual(got, c) {
		t.Errorf("ReadCheckpointFile = %+v, want %+v", got, c)
	}
	if _, err := ReadCheckpointFile(filepath.Join(t.TempDir(), "none.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadCheckpointFile of a missing file: %v, want fs.ErrNotExist", err)
	}
}

func TestReadCheckpointFileRejects(t *testing.T) {
	tests := []struct {
		name string
		data string
	}{
		{"not json", `seq=1`},
		{"no seq", `{"hash":"00","time":"2026-11-22T10:00:00Z","key_id":"k","signature":"AA=="}`},
		{"bad hash", `{"seq":1,"hash":"zz","time":"2026-11-22T10:00:00Z","key_id":"k","signature":"AA=="}`},
		{"empty hash", `{"seq":1,"hash":"","time":"2026-11-22T10:00:00Z","key_id":"k","signature":"AA=="}`},
		{"bad time", `{"seq":1,"hash":"00","time":"yesterday","key_id":"k","signature":"AA=="}`},
		{"bad signature", `{"seq":1,"hash":"00","time":"2026-11-22T10:00:00Z","key_id":"k","signature":"%%"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cp.json")
			if err := os.WriteFile(path, []byte(tt.data), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := ReadCheckpointFile(path)
			var pe *fs.PathError
			if err == nil || errors.As(err, &pe) {
				t.Errorf("ReadCheckpointFile = %v, want a content error", err)
			}
		})
	}
}

// TestCheckpointRefusesDivergedChain: once records a checkpoint signed are
// gone, checkpointing must not overwrite the file that proves it.
func TestCheckpointRefusesDivergedChain(t *testing.T) {
	tests := []struct {
		name   string
		fresh  bool // a new logger, which knows only the file
		regrow int
	}{
		{name: "same logger, tail cut", regrow: 0},
		{name: "same logger, tail cut and regrown", regrow: 5},
		{name: "fresh logger, tail cut", fresh: true, regrow: 1},
		{name: "fresh logger, tail cut and regrown", fresh: true, regrow: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.record(t, 10)
			e.checkpoint(t)
			before, err := os.ReadFile(e.cpFile)
			if err != nil {
				t.Fatal(err)
			}
			e.tamper(t, stmts(`DELETE FROM audit_records WHERE seq >= 8`, `DELETE FROM audit_checkpoints`))
			e.record(t, tt.regrow)

			l := e.l
			if tt.fresh {
				l = e.logger(t)
			}
			if _, err := l.Checkpoint(context.Background()); !errors.Is(err, ErrDiverged) {
				t.Fatalf("Checkpoint error = %v, want ErrDiverged", err)
			}
			after, err := os.ReadFile(e.cpFile)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("checkpoint file overwritten:\n%s\nbecame\n%s", before, after)
			}
			if cps, err := e.st.ListAuditCheckpoints(context.Background()); err != nil || len(cps) != 0 {
				t.Errorf("checkpoints stored = %v, %v; want none", cps, err)
			}
		})
	}
}

// TestCheckpointDistrustsForeignCheckpoint: a checkpoint planted at the
// head by someone without the key must not make checkpoints no-ops.
func TestCheckpointDistrustsForeignCheckpoint(t *testing.T) {
	e := newEnv(t)
	e.record(t, 3)
	head := e.records(t)[2]
	forged := store.AuditCheckpoint{Seq: 3, Hash: head.Hash, Time: head.Time, KeyID: "ed25519:0000000000000000", Signature: make([]byte, 64)}
	if err := e.st.InsertAuditCheckpoint(context.Background(), forged); err != nil {
		t.Fatal(err)
	}
	c := e.checkpoint(t)
	if !signedBy(testSignKey.Public().(ed25519.PublicKey), c) || c.Seq != 3 {
		t.Fatalf("Checkpoint = %+v, want our own signed checkpoint of record 3", c)
	}
	fc, err := ReadCheckpointFile(e.cpFile)
	if err != nil {
		t.Fatal(err)
	}
	if !checkpointsEqual(fc, c) {
		t.Errorf("checkpoint file holds %+v, want %+v", fc, c)
	}
	rep, err := e.l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.FirstBadSeq != 3 || !strings.Contains(rep.Problem, "bad signature") {
		t.Errorf("Verify = %+v, want the planted checkpoint reported", rep)
	}
}

// TestCheckpointRace: two loggers sharing a store checkpoint the same head;
// the second finds the first's checkpoint in its way and takes it as done.
func TestCheckpointRace(t *testing.T) {
	e := newEnv(t)
	other := e.logger(t)
	e.record(t, 2)
	e.checkpoint(t)
	if _, err := other.Checkpoint(context.Background()); err != nil { // loads what e.l stored
		t.Fatal(err)
	}
	e.record(t, 1)
	e.checkpoint(t)
	c, err := other.Checkpoint(context.Background())
	if err != nil {
		t.Fatalf("Checkpoint after another process's checkpoint of the same head: %v", err)
	}
	if c.Seq != 3 {
		t.Errorf("Checkpoint seq = %d, want 3", c.Seq)
	}
	rep, err := e.l.Verify(context.Background())
	if err != nil || !rep.OK || rep.CheckpointsChecked != 3 {
		t.Errorf("Verify = %+v, %v; want OK with 3 checkpoints", rep, err)
	}
}

func TestCheckpointStoreFailure(t *testing.T) {
	m := &memStore{}
	l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Record(context.Background(), testEvent(0)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	m.fail(boom)
	if _, err := l.Checkpoint(context.Background()); !errors.Is(err, boom) {
		t.Errorf("Checkpoint error = %v, want %v", err, boom)
	}
}

func TestRun(t *testing.T) {
	e := newEnv(t)
	l, err := New(Config{
		Store: e.st, ChainKey: testChainKey, CheckpointKey: testSignKey, CheckpointFile: e.cpFile,
		Now: e.clock.Now, CheckpointInterval: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()

	if _, err := l.Record(ctx, testEvent(1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		cps, err := e.st.ListAuditCheckpoints(context.Background())
		return err == nil && len(cps) > 0 && cps[len(cps)-1].Seq == 1
	})
	// The record after the last tick is covered by the checkpoint Run takes
	// as it stops, even though the context it was given has ended.
	if _, err := l.Record(ctx, testEvent(2)); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	fc, err := ReadCheckpointFile(e.cpFile)
	if err != nil {
		t.Fatal(err)
	}
	if fc.Seq != 2 {
		t.Errorf("last checkpoint covers record %d, want 2", fc.Seq)
	}
}

// TestRunSurvivesFailures: a failing store does not stop Run.
func TestRunSurvivesFailures(t *testing.T) {
	m := &memStore{}
	l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey, CheckpointInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Record(context.Background(), testEvent(0)); err != nil {
		t.Fatal(err)
	}
	m.fail(errors.New("disk on fire"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	time.Sleep(20 * time.Millisecond)
	m.fail(nil)
	waitFor(t, func() bool {
		cps, _ := m.ListAuditCheckpoints(context.Background())
		return len(cps) == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkRecord measures one durable append, hash included.
func BenchmarkRecord(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	ev := testEvent(0)
	for b.Loop() {
		if _, err := e.l.Record(ctx, ev); err != nil {
			b.Fatal(err)
		}
	}
}
