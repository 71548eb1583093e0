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

// The commands that take the locks, which the lock file names beside the
// pid for a refused process's message: the way out depends on whether
// an authority serves (stop it) or a command works for a while (wait).
const (
	HolderAuthority = "muster authority"
	HolderReapply   = "muster store reapply"
)

// LockHolder is the pid the lock file names: the holder's while the lock
// is held, else the last holder's; 0 if none.
func (d Dir) LockHolder() int { pid, _ := lockHolder(d.LockFile()); return pid }

// lockHolder is the pid the lock file at path names, 0 if none, and the
// command it names: HolderAuthority for a file of a muster that wrote
// only the pid.
func lockHolder(path string) (pid int, command string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, HolderAuthority
	}
	first, rest, _ := strings.Cut(string(b), "\n")
	command = strings.TrimSpace(rest)
	if command == "" {
		command = HolderAuthority
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && pid > 0 {
		return pid, command
	}
	return 0, command
}

// lockedError is a refusal over a lock another process holds: Error is
// its message, and errors.Is matches its sentinel (ErrLocked,
// ErrStoreLocked), whose own text names an authority.
type lockedError struct {
	sentinel error
	msg      string
}

func (e *lockedError) Error() string { return e.msg }
func (e *lockedError) Unwrap() error { return e.sentinel }

// busy is the refusal over what, held by command (not an authority) with
// pid: it ends by itself.
func busy(sentinel error, command string, pid int, what string) error {
	return &lockedError{sentinel, fmt.Sprintf("datadir: %s%s works on %s: run this again once it has finished", command, pidNote(pid), what)}
}

// lockPID takes flock(2) on path for this process and writes its pid
// there, for a refused process's message; the kernel releases the lock
// when the process dies however it dies, so a stale file never blocks a
// restart. held is the holder's pid (0 if unknown) when another process
// holds it: then err wraps syscall.EWOULDBLOCK, and command is the
// holder's (as the file names it).
func lockPID(path, command string) (release func(), held int, holder string, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, 0, "", fmt.Errorf("datadir: cannot open %s: %w", path, oserr.Reason(err))
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid, holder := lockHolder(path)
			return nil, pid, holder, err
		}
		return nil, 0, "", fmt.Errorf("datadir: cannot lock %s: %w", path, oserr.Reason(err))
	}
	// Only the holder writes, so the pid read by a refused process is
	// the holder's (or empty for an instant while it is written).
	if err := f.Truncate(0); err == nil {
		// An authority's holds its pid alone, as before: scripts and the
		// docs read it with $(cat DIR/authority.lock).
		content := strconv.Itoa(os.Getpid()) + "\n"
		if command != HolderAuthority {
			content += command + "\n"
		}
		f.WriteAt([]byte(content), 0)
	}
	return func() { f.Close() }, 0, "", nil
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
func (d Dir) Lock() (release func(), err error) { return d.LockAs(HolderAuthority) }

// LockAs is Lock for command (HolderAuthority, HolderReapply), which the
// lock file names to a refused process.
func (d Dir) LockAs(command string) (release func(), err error) {
	release, held, holder, err := lockPID(d.LockFile(), command)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		if holder != HolderAuthority {
			return nil, busy(ErrLocked, holder, held, string(d))
		}
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
	return LockSQLiteStoreAs(db, HolderAuthority)
}

// LockSQLiteStoreAs is LockSQLiteStore for command, which the lock file
// names to a refused process.
func LockSQLiteStoreAs(db, command string) (release func(), err error) {
	abs, err := filepath.Abs(db)
	if err != nil {
		return nil, fmt.Errorf("datadir: %w", err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	release, held, holder, err := lockPID(SQLiteLockFile(abs), command)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		if holder != HolderAuthority {
			return nil, busy(ErrStoreLocked, holder, held, "the SQLite store "+abs)
		}
		return nil, fmt.Errorf("%w%s: %s; one authority at a time uses an SQLite store: stop the other first "+
			"(several replicas need PostgreSQL: docs/high-availability.md)", ErrStoreLocked, pidNote(held), abs)
	}
	return release, err
}

// HeldByCommand reports a refusal (of Lock, LockSQLiteStore and their
// …As) over a lock an offline command holds rather than an authority:
// its way out is to wait, not to stop an authority.
func HeldByCommand(err error) bool {
	var l *lockedError
	return errors.As(err, &l)
}
