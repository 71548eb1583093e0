package datadir

import (
	"errors"
	"fmt"
	"os"
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
func (d Dir) LockHolder() int {
	b, err := os.ReadFile(d.LockFile())
	if err != nil {
		return 0
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		return pid
	}
	return 0
}

// Lock takes the directory for this process: a second authority on the
// same directory would overwrite authority.addr and the audit checkpoint
// under the first. The lock is flock(2) on DIR/authority.lock, so the
// kernel releases it when the process dies however it dies, and a stale
// file never blocks a restart. The file holds the holder's pid, for the
// message only. Call the returned function to release it.
func (d Dir) Lock() (release func(), err error) {
	f, err := os.OpenFile(d.LockFile(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("datadir: cannot open %s: %w", d.LockFile(), oserr.Reason(err))
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := ""
		if pid := d.LockHolder(); pid > 0 {
			holder = fmt.Sprintf(" (pid %d)", pid)
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w%s: %s; stop it first, or give another --data", ErrLocked, holder, d)
		}
		return nil, fmt.Errorf("datadir: cannot lock %s: %w", d.LockFile(), oserr.Reason(err))
	}
	// Only the holder writes, so the pid read by a refused process is
	// the holder's (or empty for an instant while it is written).
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
