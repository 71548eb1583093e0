package audit

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// The checkpoint file and the head file are shared by every process that
// appends to the chain from one data directory: the authority, and the
// offline commands run beside it (admin add --offline, ca rotate
// --offline, ca migrate-custody, ca root export-key), which must work
// while it runs. Each file only moves forward, and a process knows only
// what it wrote itself, so each write reads the file and keeps a newer
// one, under an flock(2) of the lock file that makes the read and the
// write one step across processes. Without it the last writer wins, and a
// process that appended record 7 could overwrite the 8 another had just
// noted, leaving a cut tail unseen.

// fileLockWait bounds the wait for another process's write: each holds the
// lock for one small read and write, so a holder past this is stuck (a
// stopped process), and an append must not hang on it. The write is then
// reported and left to the next one.
const fileLockWait = 5 * time.Second

// errFileLockBusy reports a lock file another process held past fileLockWait.
var errFileLockBusy = errors.New("audit: lock file held by another process")

// errHeadLockStillBusy is errFileLockBusy of a head file note that did
// not wait, as the write before it had waited out the lock already.
var errHeadLockStillBusy = fmt.Errorf("%w, still (not waited for again until it is free)", errFileLockBusy)

// lockFile takes the exclusive flock(2) of path, creating it 0600, and
// returns its release. Every call opens the file anew: flock(2) locks
// belong to the open file, so two holders in one process exclude each
// other as two processes do.
func lockFile(path string) (release func(), err error) {
	f, err := openLockFile(path)
	if err != nil {
		return nil, err
	}
	if err := flockWait(f, fileLockWait); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// openLockFile opens (creating it 0600) the lock file at path.
func openLockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: lock file: %w", err)
	}
	return f, nil
}

// flockWait takes the exclusive flock(2) of f, waiting at most wait for
// another holder (0: trying once). funlock releases it.
func flockWait(f *os.File, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 20*time.Millisecond) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("audit: lock file %s: %w", f.Name(), err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w for %s: %s", errFileLockBusy, wait, f.Name())
		}
		time.Sleep(pause)
	}
}

// funlock releases the flock(2) flockWait took.
func funlock(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }

// lockedIf is lockFile, or nothing to release when path is "".
func lockedIf(path string) (release func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	return lockFile(path)
}
