package audit

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A store restored from a backup on purpose: the refusal to start names
// every file outside the store that is ahead of it, and removing what it
// names leaves a chain that verifies and checkpoints again. (Removing the
// head file alone left audit-checkpoint.json covering the lost records,
// so every audit verify after the restore reported tampering.)
func TestRestoredStoreWayOut(t *testing.T) {
	// A space in the path: the way out is pasted into a shell.
	dir := filepath.Join(t.TempDir(), "data dir")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cpFile, headFile := filepath.Join(dir, "audit-checkpoint.json"), filepath.Join(dir, "audit-head")
	m := &memStore{}
	open := func() *Logger {
		l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey, CheckpointFile: cpFile, HeadFile: headFile})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := open()
	ctx := t.Context()
	record := func(l *Logger, n int) {
		for i := 0; i < n; i++ {
			if _, err := l.Record(ctx, Event{Actor: "a", Action: "x", Result: ResultOK}); err != nil {
				t.Fatal(err)
			}
		}
	}
	record(l, 3)
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	backupRecs, backupCps := slices.Clone(m.recs), slices.Clone(m.cps)
	record(l, 3)
	if _, err := l.Checkpoint(ctx); err != nil { // as at a stop
		t.Fatal(err)
	}

	m.recs, m.cps = backupRecs, backupCps // the backup copied back
	l = open()
	err := l.CheckHead(ctx)
	if !errors.Is(err, ErrShortChain) || !strings.Contains(err.Error(), headFile) || !strings.Contains(err.Error(), cpFile) || !strings.Contains(err.Error(), wayOutLead) {
		t.Fatalf("CheckHead after a restore: %v, want ErrShortChain naming %s and %s", err, headFile, cpFile)
	}
	// audit verify --offline, run to read why the authority refused to
	// start, names the same way out (it once said only that records were
	// removed from the tail).
	rep, err := l.Verify(ctx)
	if err != nil || rep.OK || !strings.Contains(rep.Problem, wayOutLead) {
		t.Fatalf("verify after a restore: %+v, %v; want the way out naming %s and %s", rep, err, headFile, cpFile)
	}
	// Both say it as a command that works pasted into a shell, and moves
	// the files aside, kept, rather than removing them (it once said only
	// "remove FILE and FILE", and the docs said to keep them).
	pasteWayOut(t, rep.Problem)
	for _, f := range []string{headFile, cpFile} {
		if _, err := os.Stat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s after the way out: %v, want it moved aside", f, err)
		}
	}
	kept, _ := filepath.Glob(filepath.Join(dir, "audit-before-restore.*", "*"))
	if len(kept) != 2 {
		t.Fatalf("kept after the way out: %q, want both files", kept)
	}
	l = open()
	if err := l.CheckHead(ctx); err != nil {
		t.Fatal(err)
	}
	record(l, 1)
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatalf("checkpoint after the way out: %v", err)
	}
	if rep, err := l.Verify(ctx); err != nil || !rep.OK {
		t.Fatalf("verify after the way out: %+v, %v", rep, err)
	}
}

// The head file removed alone after the tail was cut (or a restore): the
// checkpoint file still covers the lost records, and the chain must not
// be appended to, reusing their numbers. A logger once started on it,
// checking only the head file, and audit verify then reported tampering
// for good.
func TestCheckHeadWithoutHeadFile(t *testing.T) {
	dir := t.TempDir()
	cpFile, headFile := filepath.Join(dir, "audit-checkpoint.json"), filepath.Join(dir, "audit-head")
	m := &memStore{}
	open := func() *Logger {
		l, err := New(Config{Store: m, ChainKey: testChainKey, CheckpointKey: testSignKey, CheckpointFile: cpFile, HeadFile: headFile})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctx := t.Context()
	l := open()
	for i := 0; i < 6; i++ {
		if _, err := l.Record(ctx, Event{Actor: "a", Action: "x", Result: ResultOK}); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			if _, err := l.Checkpoint(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	backupRecs, backupCps := slices.Clone(m.recs[:3]), slices.Clone(m.cps)
	if _, err := l.Checkpoint(ctx); err != nil { // as at a stop
		t.Fatal(err)
	}
	m.recs, m.cps = backupRecs, backupCps
	if err := os.Remove(headFile); err != nil {
		t.Fatal(err)
	}
	err := open().CheckHead(ctx)
	if !errors.Is(err, ErrShortChain) || !strings.Contains(err.Error(), "the checkpoint in "+cpFile+" covers record 6") || strings.Contains(err.Error(), headFile) {
		t.Fatalf("CheckHead with the head file removed: %v, want ErrShortChain naming %s and not the missing %s", err, cpFile, headFile)
	}
	// The way out it names, pasted, leaves a chain that is appended to and
	// verifies. It once named the missing head file too.
	pasteWayOut(t, err.Error())
	l = open()
	if err := l.CheckHead(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Record(ctx, Event{Actor: "a", Action: "x", Result: ResultOK}); err != nil {
		t.Fatal(err)
	}
	if rep, err := l.Verify(ctx); err != nil || !rep.OK {
		t.Fatalf("verify after the way out: %+v, %v", rep, err)
	}
}

// wayOutLead comes before the command restoredWayOut names.
const wayOutLead = "restored from a backup on purpose, move them aside, kept as the evidence of what it removed: "

// pasteWayOut runs, in a shell, the command after wayOutLead in msg, to
// its end.
func pasteWayOut(t *testing.T, msg string) {
	t.Helper()
	_, cmd, ok := strings.Cut(msg, wayOutLead)
	if !ok {
		t.Fatalf("no way out in %q", msg)
	}
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatalf("the way out %q pasted: %v: %s", cmd, err, out)
	}
}
