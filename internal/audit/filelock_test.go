package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// sharedDir is the audit files of one data directory and two loggers on
// them and one store: an authority and an offline command beside it (two
// Loggers stand for two processes, as each holds only what it wrote).
type sharedDir struct {
	m                  *memStore
	cp, head, lock     string
	authority, offline *Logger
}

func newSharedDir(t *testing.T, authorityStore Store) *sharedDir {
	t.Helper()
	dir := t.TempDir()
	s := &sharedDir{m: &memStore{}, cp: filepath.Join(dir, "cp.json"), head: filepath.Join(dir, "head"), lock: filepath.Join(dir, "audit.lock")}
	logger := func(st Store) *Logger {
		l, err := New(Config{Store: st, ChainKey: testChainKey, CheckpointKey: testSignKey,
			CheckpointFile: s.cp, HeadFile: s.head, LockFile: s.lock})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if authorityStore == nil {
		authorityStore = s.m
	}
	s.authority, s.offline = logger(authorityStore), logger(s.m)
	return s
}

// TestHeadFileNeverMovesBack: a process that appended record 2 and notes
// it after another process noted record 3 leaves the head file at 3. It
// was overwritten with 2, so cutting record 3 from the tail went unseen.
func TestHeadFileNeverMovesBack(t *testing.T) {
	s := newSharedDir(t, nil)
	ctx := t.Context()
	if _, err := s.authority.Record(ctx, Event{Actor: "a", Action: "first", Result: ResultOK}); err != nil {
		t.Fatal(err)
	}
	// The authority's store write commits record 2; before it notes it,
	// the offline command appends record 3 and notes it.
	link, err := s.authority.Builder(Event{Actor: "a", Action: "join", Result: ResultOK})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.m.AppendAudit(ctx, link.Build); err != nil {
		t.Fatal(err)
	}
	if _, err := s.offline.Record(ctx, Event{Actor: "offline", Action: "operator.add", Result: ResultOK}); err != nil {
		t.Fatal(err)
	}
	s.authority.Appended(link)

	got, err := ReadHeadFile(s.head)
	if want := s.m.recs[2]; err != nil || got.Seq != 3 || !bytes.Equal(got.Hash, want.Hash) {
		t.Fatalf("head file %+v, %v; want record 3, the newest", got, err)
	}
	whole := s.m.recs
	s.m.recs = whole[:2] // record 3 cut from the tail
	if err := s.authority.CheckHead(ctx); !errors.Is(err, ErrShortChain) {
		t.Fatalf("CheckHead after record 3 was cut = %v, want ErrShortChain", err)
	}

	// A newer record of the process itself still moves the file on.
	s.m.recs = whole
	if _, err := s.authority.Record(ctx, Event{Actor: "a", Action: "later", Result: ResultOK}); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadHeadFile(s.head); err != nil || got.Seq != 4 {
		t.Fatalf("head file after record 4: %+v, %v", got, err)
	}
}

// checkpointHook runs before each checkpoint is inserted, as a
// checkpoint of another process could be taken between this process's
// reading the head and its writing the file.
type checkpointHook struct {
	*memStore
	before func()
}

func (h *checkpointHook) InsertAuditCheckpoint(ctx context.Context, c store.AuditCheckpoint) error {
	if f := h.before; f != nil {
		h.before = nil
		f()
	}
	return h.memStore.InsertAuditCheckpoint(ctx, c)
}

// TestCheckpointFileNeverMovesBack: a checkpoint of record 1, written
// after another process wrote its checkpoint of record 2, leaves the file
// at record 2.
func TestCheckpointFileNeverMovesBack(t *testing.T) {
	hook := &checkpointHook{}
	s := newSharedDir(t, hook)
	hook.memStore = s.m
	ctx := t.Context()
	if _, err := s.authority.Record(ctx, Event{Actor: "a", Action: "first", Result: ResultOK}); err != nil {
		t.Fatal(err)
	}
	hook.before = func() {
		if _, err := s.offline.Record(ctx, Event{Actor: "offline", Action: "operator.add", Result: ResultOK}); err != nil {
			t.Fatal(err)
		}
		if c, err := s.offline.Checkpoint(ctx); err != nil || c.Seq != 2 {
			t.Fatalf("the other process's checkpoint: %+v, %v", c, err)
		}
	}
	if c, err := s.authority.Checkpoint(ctx); err != nil || c.Seq != 1 {
		t.Fatalf("checkpoint = %+v, %v; want record 1's", c, err)
	}
	if fc, err := ReadCheckpointFile(s.cp); err != nil || fc.Seq != 2 {
		t.Fatalf("checkpoint file %+v, %v; want the checkpoint of record 2", fc, err)
	}
	// Cutting record 2 and the store's checkpoint of it is still caught.
	s.m.recs = s.m.recs[:1]
	s.m.cps = s.m.cps[:1]
	if rep, err := s.authority.Verify(ctx); err != nil || rep.OK {
		t.Fatalf("Verify after record 2 and its checkpoint were cut: %+v, %v", rep, err)
	}
}

// TestLockFileExcludesAnotherHolder: while one holds the lock another
// open file cannot take it (as another process could not), and can once
// it is released; the file is 0600.
func TestLockFileExcludesAnotherHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.lock")
	release, err := lockFile(path)
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("flock while held = %v, want EWOULDBLOCK", err)
	}
	release()
	again, err := lockFile(path)
	if err != nil {
		t.Fatalf("lockFile after release: %v", err)
	}
	again()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file %v, %v; want mode 0600", fi, err)
	}
}

// BenchmarkHeadFileNote is the cost of one head file write, without and
// with the lock file (open, flock, read back, write, close).
func BenchmarkHeadFileNote(b *testing.B) {
	for _, locked := range []bool{false, true} {
		name := "unlocked"
		if locked {
			name = "locked"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			h := &headFile{path: filepath.Join(dir, "head")}
			if locked {
				h.lock = filepath.Join(dir, "audit.lock")
			}
			hash := bytes.Repeat([]byte{1}, 32)
			for i := range b.N {
				if err := h.note(int64(i+1), hash); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestHeadFileWaitsOnceForAStuckHolder: with the lock file held past
// fileLockWait (a stuck process), the note that found it so waits once;
// the appends after it try the lock without waiting until a write gets
// it again, rather than each waiting fileLockWait in turn behind the head
// file's mutex (every append, a renewal's too, notes the head file before
// it answers: N appends queued behind a stuck holder waited N times 5 s).
// Once the lock is free the next note writes the newest record.
func TestHeadFileWaitsOnceForAStuckHolder(t *testing.T) {
	dir := t.TempDir()
	h := &headFile{path: filepath.Join(dir, "head"), lock: filepath.Join(dir, "audit.lock")}
	hash := bytes.Repeat([]byte{1}, 32)
	stuck, err := lockFile(h.lock)
	if err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= 3; seq++ {
		if err := h.note(seq, hash); !errors.Is(err, errFileLockBusy) {
			t.Fatalf("note %d with the lock held: %v, want errFileLockBusy", seq, err)
		}
	}
	if h.lockWaits != 1 {
		t.Fatalf("3 notes behind a stuck holder waited out the lock %d times; want 1", h.lockWaits)
	}
	stuck()
	if err := h.note(4, hash); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadHeadFile(h.path); err != nil || got.Seq != 4 {
		t.Fatalf("head file once the lock is free: %+v, %v; want record 4", got, err)
	}
	// A write got the lock: a holder stuck again is waited for again.
	stuck, err = lockFile(h.lock)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck()
	if err := h.note(5, hash); !errors.Is(err, errFileLockBusy) || h.lockWaits != 2 {
		t.Fatalf("note after a write, the lock held again: %v, %d waits; want errFileLockBusy after a second wait", err, h.lockWaits)
	}
}
