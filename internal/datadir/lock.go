package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/muster-dev/muster/internal/oserr"
)

// LockFile is where the running authority holds its lock on the directory.
func (d Dir) LockFile() string { return d.path("authority.lock") }

// ErrLocked reports a data directory another authority process runs on.
var ErrLocked = errors.New("datadir: in use by another authority")

// LockHolder is the pid the lock file names: the holder's while the lock
// is held, else the last holder's; 0 if none.
func (d Dir) LockHolder() int { return lockHolder(d.LockFile()) }

// lockHolder is the pid the lock file at path names; 0 if none.
func lockHolder(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		return pid
	}
	return 0
}

// lockPID takes flock(2) on path for this process and writes its pid
// there, for a refused process's message; the kernel releases the lock
// when the process dies however it dies, so a stale file never blocks a
// restart. held is the holder's pid (0 if unknown) when another process
// holds it: then err wraps syscall.EWOULDBLOCK.
func lockPID(path string) (release func(), held int, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("datadir: cannot open %s: %w", path, oserr.Reason(err))
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, lockHolder(path), err
		}
		return nil, 0, fmt.Errorf("datadir: cannot lock %s: %w", path, oserr.Reason(err))
	}
	// Only the holder writes, so the pid read by a refused process is
	// the holder's (or empty for an instant while it is written).
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, 0, nil
}

// pidNote is " (pid N)" for a known holder.
func pidNote(pid int) string {
	if pid <= 0 {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", pid)
}

// Lock takes the directory for this process: a second authority on the
// same directory would overwrite authority.addr and the audit checkpoint
// under the first. The lock is flock(2) on DIR/authority.lock, so the
// kernel releases it when the process dies however it dies, and a stale
// file never blocks a restart. The file holds the holder's pid, for the
// message only. Call the returned function to release it.
func (d Dir) Lock() (release func(), err error) {
	release, held, err := lockPID(d.LockFile())
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, fmt.Errorf("%w%s: %s; stop it first, or give another --data", ErrLocked, pidNote(held), d)
	}
	return release, err
}

// ErrStoreLocked reports an SQLite store another authority process runs
// on, from another data directory.
var ErrStoreLocked = errors.New("datadir: the SQLite store is in use by another authority")

// SQLiteLockFile is where the running authority holds its lock on the
// SQLite database file db, beside it as SQLite's own -wal and -shm files.
func SQLiteLockFile(db string) string { return db + "-authority.lock" }

// LockSQLiteStore takes the SQLite database file db for this process,
// as Lock takes the data directory. The directory's lock alone does not
// make this process the store's one authority: a copy of the directory
// (the same authority, so the store's check passes it) given --store
// sqlite://DIR/muster.db would run a second authority on the same file,
// and on SQLite every authority leads every background job and takes
// its own settings for the store's (docs/high-availability.md). Offline
// commands do not take it: they work beside the authority. db is
// resolved through symbolic links first, so that two names of one file
// take one lock. Call the returned function to release it.
func LockSQLiteStore(db string) (release func(), err error) {
	abs, err := filepath.Abs(db)
	if err != nil {
		return nil, fmt.Errorf("datadir: %w", err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	release, held, err := lockPID(SQLiteLockFile(abs))
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, fmt.Errorf("%w%s: %s; one authority at a time uses an SQLite store: stop the other first "+
			"(several replicas need PostgreSQL: docs/high-availability.md)", ErrStoreLocked, pidNote(held), abs)
	}
	return release, err
}
