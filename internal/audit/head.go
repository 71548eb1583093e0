package audit

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/store"
)

// The head file holds the newest record appended from its directory:
// "SEQ HEX-HASH\n", rewritten in place after every append (with replicas,
// each replica's file is the witness of the records it and the offline
// commands run on its directory appended; with a lock file a write never
// replaces a newer record another process noted, filelock.go).
// Checkpoints are signed but only taken every CheckpointInterval; records
// removed from the tail of the chain after a crash, before the next
// checkpoint, left nothing that missed them. The head file does: Verify
// reports a chain shorter than it, and CheckHead (at start) refuses to
// append to one, which would reuse the removed records' sequence numbers.
//
// The file is written without fsync: it survives the process being killed
// (the threat here), and after an OS crash it may lag the store, which is
// never taken for tampering. Like the checkpoint file it is only as safe as
// the data directory: whoever can write both the store and the directory
// can cut the tail unseen.

// headFileSize is the fixed size of the file's content (padded with
// spaces), so an in-place rewrite never leaves a longer old tail behind.
const headFileSize = 96

// headFile keeps the file of one Logger.
type headFile struct {
	path string
	lock string // the lock file, "" for none

	// lockF is the lock file, kept open for the head file's writes alone
	// (under mu): its own open file, so the checkpoint's lock, taken
	// through another, excludes it as another process's would.
	lockF *os.File
	// lockStuck: the last write found the lock held past fileLockWait
	// (a stuck process). Until a write takes it again, a note tries it
	// once and does not wait: every append notes the head file before it
	// answers, behind mu, so N appends queued behind a stuck holder would
	// each wait fileLockWait in turn. lockWaits counts the waits that ran
	// out, for the tests.
	lockStuck bool
	lockWaits int

	mu  sync.Mutex // held while the file is written
	f   *os.File
	fi  fs.FileInfo // f's, to tell it is still the file at path
	seq int64       // the newest seq written, never lowered
	// writes counts the writes of the file, notes (under newest) the
	// calls of note: what the tests check.
	writes int

	// newest is the newest record noted, written or not: the writes of a
	// batch commit together, and one write of the file notes them all.
	newest struct {
		sync.Mutex
		seq   int64
		hash  []byte
		notes int
	}
}

// note records that the chain holds record seq with hash, and returns
// once the file holds seq or a newer record. Concurrent appends may note
// out of order; the file only moves forward. Of appends noted while the
// file is being written, the next write notes the newest alone: it holds
// every one of them, as the chain has no gaps.
func (h *headFile) note(seq int64, hash []byte) error {
	h.newest.Lock()
	h.newest.notes++
	if seq > h.newest.seq {
		h.newest.seq, h.newest.hash = seq, hash
	}
	h.newest.Unlock()

	h.mu.Lock()
	defer h.mu.Unlock()
	if seq <= h.seq {
		return nil // written already, by this note or a newer one
	}
	h.newest.Lock()
	seq, hash = h.newest.seq, h.newest.hash
	h.newest.Unlock()
	if h.f != nil && !h.stillAtPath() {
		// Removed (the way out of a damaged file names rm) or replaced
		// while this process ran: writes to the file held open would
		// reach no file at the path until a restart.
		h.f.Close()
		h.f = nil
	}
	if h.f == nil {
		f, err := os.OpenFile(h.path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("audit: head file: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("audit: head file: %w", err)
		}
		h.f, h.fi = f, fi
	}
	if h.lock != "" {
		if h.lockF == nil {
			f, err := openLockFile(h.lock)
			if err != nil {
				return fmt.Errorf("audit: head file: %w", err)
			}
			h.lockF = f
		}
		wait := fileLockWait
		if h.lockStuck {
			wait = 0
		}
		if err := flockWait(h.lockF, wait); err != nil {
			if errors.Is(err, errFileLockBusy) {
				if h.lockStuck {
					return fmt.Errorf("audit: head file: %w", errHeadLockStillBusy)
				}
				h.lockStuck = true
				h.lockWaits++
			}
			return fmt.Errorf("audit: head file: %w", err)
		}
		h.lockStuck = false
		defer funlock(h.lockF)
	}
	// Another process on the directory may have noted a newer record,
	// which holds this one (the chain has no gaps), or this one.
	cur := make([]byte, headFileSize)
	if n, _ := h.f.ReadAt(cur, 0); n > 0 {
		if noted, err := parseHead(cur[:n]); err == nil && (noted.Seq > seq || noted.Seq == seq && bytes.Equal(noted.Hash, hash)) {
			h.seq = seq
			return nil
		}
	}
	line := strconv.FormatInt(seq, 10) + " " + hex.EncodeToString(hash)
	buf := []byte(line + strings.Repeat(" ", max(headFileSize-len(line)-1, 0)) + "\n")
	if _, err := h.f.WriteAt(buf, 0); err != nil {
		return fmt.Errorf("audit: head file: %w", err)
	}
	h.seq = seq
	h.writes++
	return nil
}

// stillAtPath reports whether the file held open is still the one at
// the path: one stat a write, beside the write itself.
func (h *headFile) stillAtPath() bool {
	at, err := os.Stat(h.path)
	return err == nil && os.SameFile(at, h.fi)
}

// ReadHeadFile reads a head file: the seq and hash of the newest record
// noted. A missing file is an error wrapping fs.ErrNotExist.
func ReadHeadFile(path string) (store.AuditHead, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return store.AuditHead{}, fmt.Errorf("audit: read head file: %w", err)
	}
	h, err := parseHead(data)
	if err != nil {
		return h, fmt.Errorf("audit: head file %s: %w", path, err)
	}
	return h, nil
}

// parseHead reads the content of a head file. Its errors quote what the
// file holds (at most its first headFileSize bytes), which the operator
// compares with what muster writes there.
func parseHead(data []byte) (store.AuditHead, error) {
	held := strings.TrimSpace(string(data[:min(len(data), headFileSize)]))
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		return store.AuditHead{}, fmt.Errorf("it holds %q, not a record's SEQ HASH", held)
	}
	seq, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil || seq <= 0 || fields[0] != strconv.FormatInt(seq, 10) {
		return store.AuditHead{}, fmt.Errorf("it holds %q, whose SEQ %q is not a record's number", held, fields[0])
	}
	hash, err := hex.DecodeString(fields[1])
	if err != nil || len(hash) == 0 || len(hash) > 64 {
		return store.AuditHead{}, fmt.Errorf("it holds %q, whose HASH is not a record's hash in hex", held)
	}
	return store.AuditHead{Seq: seq, Hash: hash}, nil
}

// SetVerifyCommand names cmd, a command that walks this chain from its
// data directory (muster audit verify --offline --data DIR, with the
// --config the authority reads), in the refusal of a damaged head file:
// the first step of its way out. Call it before the logger is used.
func (l *Logger) SetVerifyCommand(cmd string) { l.verifyCmd = cmd }

// SetRestoreDoc names doc, what a restore of the store undoes and the
// command that re-applies it (muster store reapply, for the authority),
// in the way out of a chain shorter than the files outside the store
// saw: moving them aside starts the server, which then lacks whatever
// was done since the backup (locks, deletions) without a word. Call it
// before the logger is used.
func (l *Logger) SetRestoreDoc(doc string) { l.restoreDoc = doc }

// ErrDamagedHead reports a head file that does not hold a record's SEQ
// HASH: it cannot tell whether records were removed from the tail.
var ErrDamagedHead = errors.New("audit: the head file is damaged")

// damagedHeadError is ErrDamagedHead with what is wrong and the way out,
// which name the file already.
type damagedHeadError struct{ text string }

func (e damagedHeadError) Error() string        { return "audit: " + e.text }
func (e damagedHeadError) Is(target error) bool { return target == ErrDamagedHead }

// walked is what a walk of the chain (Verify) found whole: the newest
// record, and the newest a signed checkpoint covers (0: none).
type walked struct{ head, checkpoint int64 }

// damagedHead says what is wrong with the head file (why, from
// parseHead), and the way out: find who changed it, and remove it, which
// the next append writes anew. w: the chain was walked and found whole
// (nil: the walk comes first). Only the records a signed checkpoint
// covers are known to be all there: ones cut from the tail after it, the
// head file alone would have shown.
func (l *Logger) damagedHead(why error, w *walked) string {
	rm := "rm " + shellword.Quote(l.head.path)
	what := fmt.Sprintf("the head file %s is damaged: %v; muster writes the sequence number and hash of the newest record appended there, "+
		"which reveals records removed from the chain's tail since the last checkpoint", l.head.path, why)
	if w != nil {
		found := fmt.Sprintf("every record is in place (a signed checkpoint covers the newest, record %d)", w.head)
		switch {
		case w.checkpoint == 0:
			found = fmt.Sprintf("the chain is whole to record %d, but no signed checkpoint covers it yet: records removed from its tail, only this file could show", w.head)
		case w.checkpoint < w.head:
			found = fmt.Sprintf("the chain is whole to record %d and a signed checkpoint covers it to record %d: records removed from its tail after %d, only this file could show",
				w.head, w.checkpoint, w.checkpoint)
		}
		return what + fmt.Sprintf("; %s. Find out who changed the file, then remove it: %s (the next record appended writes it anew, "+
			"as an authority running on this directory does at its next append)", found, rm)
	}
	walk := l.verifyCmd
	if walk == "" {
		walk = "audit verify --offline from the data directory"
	}
	return what + fmt.Sprintf(", so nothing is appended until it is mended: walk the chain with %s; if it finds no record missing or changed, "+
		"find out who changed the file, then remove it: %s (the next record appended writes it anew); if it finds records missing, "+
		"restore the store from a backup", walk, rm)
}

// checkHead compares the chain with the head file: "" when the chain holds
// the noted record, else what is wrong, for an operator. damaged is the
// reason a head file that does not parse was not read (problem is then
// "").
func (l *Logger) checkHead(ctx context.Context) (problem string, firstBad int64, damaged, err error) {
	if l.head == nil {
		return "", 0, nil, nil
	}
	data, err := os.ReadFile(l.head.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", 0, nil, nil
	case err != nil:
		return "", 0, nil, fmt.Errorf("audit: read head file: %w", err)
	}
	noted, err := parseHead(data)
	if err != nil {
		return "", 0, err, nil
	}
	recs, err := l.st.ListAudit(ctx, store.AuditFilter{AfterSeq: noted.Seq - 1, Limit: 1})
	if err != nil {
		return "", 0, nil, err
	}
	if len(recs) == 0 || recs[0].Seq != noted.Seq {
		head, err := l.st.AuditHead(ctx)
		if err != nil {
			return "", 0, nil, err
		}
		return fmt.Sprintf("the chain ends at record %d, but record %d was appended (head file %s): records %d to %d were removed from the tail",
			head.Seq, noted.Seq, l.head.path, head.Seq+1, noted.Seq), head.Seq + 1, nil, nil
	}
	if !bytes.Equal(recs[0].Hash, noted.Hash) {
		return fmt.Sprintf("record %d differs from the one appended (head file %s): the tail was replaced", noted.Seq, l.head.path), noted.Seq, nil, nil
	}
	return "", 0, nil, nil
}

// ErrShortChain reports a chain that lost records the head file saw
// appended.
var ErrShortChain = errors.New("audit: the chain lost records")

// CheckHead returns an error wrapping ErrShortChain if the chain no longer
// holds the newest record the head file noted: a server must not append to
// such a chain, as it would reuse the removed records' sequence numbers.
// A head file that does not parse is refused too (ErrDamagedHead): it
// cannot say whether the tail was cut.
func (l *Logger) CheckHead(ctx context.Context) error {
	problem, _, damaged, err := l.checkHead(ctx)
	if err != nil {
		return fmt.Errorf("audit: checking the head file: %w", err)
	}
	if damaged != nil {
		return damagedHeadError{l.damagedHead(damaged, nil)}
	}
	if problem == "" {
		if problem, err = l.checkCheckpointFile(ctx); err != nil {
			return fmt.Errorf("audit: checking the checkpoint file: %w", err)
		}
	}
	if problem != "" {
		return fmt.Errorf("%w: %s; restore the store from a backup and find out who removed them; %s", ErrShortChain, problem, l.restoredWayOut())
	}
	return nil
}

// checkCheckpointFile compares the chain with the checkpoint file: "" when
// the chain reaches the record it covers. The head file alone removed (or
// never written) must not let a cut chain be appended to: the checkpoint
// file, written at every checkpoint and at the last stop, covers the
// removed records too. It is read before the chain's head, so a record
// committed meanwhile can only make the chain longer. A file missing,
// damaged or not signed with this chain's key is left to Verify to report.
func (l *Logger) checkCheckpointFile(ctx context.Context) (string, error) {
	if l.file == "" {
		return "", nil
	}
	c, err := ReadCheckpointFile(l.file)
	if err != nil || !signedBy(l.pub, c) {
		return "", nil
	}
	head, err := l.st.AuditHead(ctx)
	if err != nil {
		return "", err
	}
	if c.Seq <= head.Seq {
		return "", nil
	}
	return fmt.Sprintf("the chain ends at record %d, but the checkpoint in %s covers record %d: records %d to %d were removed from the tail",
		head.Seq, l.file, c.Seq, head.Seq+1, c.Seq), nil
}

// restoredWayOut is the way out of a chain shorter than the files outside
// the store saw, when the store was restored from a backup on purpose. It
// names both files: the checkpoint file, left in place, would have every
// audit verify report a cut tail from then on. It is a command that moves
// them aside rather than removes them: they are the evidence of how many
// records the restore took away, and a directory of its own for each
// restore (mktemp -d) keeps an earlier restore's evidence.
func (l *Logger) restoredWayOut() string {
	// Only the files there: mv refuses a missing one (the head file
	// removed alone leaves the checkpoint file to refuse).
	var files []string
	dir := ""
	for _, f := range []string{l.headPath(), l.file} {
		if _, err := os.Lstat(f); f != "" && err == nil {
			files = append(files, shellword.Quote(f))
			dir = filepath.Dir(f)
		}
	}
	if len(files) == 0 {
		return "if the store was restored from a backup on purpose, start again: no file outside the store is ahead of it any more"
	}
	aside := shellword.Quote(filepath.Join(dir, "audit-before-restore.XXXXXX"))
	undoes := ""
	if l.restoreDoc != "" {
		undoes = " (" + l.restoreDoc + ")"
	}
	return fmt.Sprintf(`if the store was restored from a backup on purpose%s, move them aside, kept as the evidence of what it removed: d=$(mktemp -d %s) && mv %s "$d"/`,
		undoes, aside, strings.Join(files, " "))
}

// noteAppended writes seq and hash to the head file, if there is one. A
// failure does not undo the append, which is durable in the store; it is
// logged, and the next append tries again.
func (l *Logger) noteAppended(seq int64, hash []byte) {
	if l.head == nil {
		return
	}
	// While the lock file stays held by a stuck process, each append
	// fails to note the head file at once: logged when it first waited
	// it out, not at every append.
	if err := l.head.note(seq, hash); err != nil && !errors.Is(err, errHeadLockStillBusy) {
		l.log.Error("audit head file not updated", "err", err)
	}
}

// headPath is the head file's path, "" without one.
func (l *Logger) headPath() string {
	if l.head == nil {
		return ""
	}
	return l.head.path
}
