//go:build unix

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lock takes an exclusive flock on the data directory itself, so a join or
// renewal by `muster agent renew` and one by a running `muster agent run`
// never interleave their writes. It waits for the holder, or ctx. Holding
// the lock, it cleans what an interrupted writer left (clean).
func (d Dir) lock(ctx context.Context) (unlock func(), err error) {
	if err := d.ensure(); err != nil {
		return nil, err
	}
	f, err := os.Open(string(d))
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			d.clean()
			return func() {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("agent: locking %s: %w", d, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LockRun takes an exclusive flock on ADIR/run.lock for as long as
// `muster agent run` runs, refusing at once if another holds it: two
// agents on one directory hold one identity, and each took the stream to
// the authority from the other (one stream per agent), over and over.
// The lock is the file's, not the directory's, which lock takes for each
// write; the kernel drops it when the process ends, however it ends.
func (d Dir) LockRun() (unlock func(), err error) {
	if err := d.ensure(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(d.path("run.lock"), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("agent: another muster agent run is running on %s (one agent per data directory: two would take the identity's stream from each other); stop it first, or give this one a directory of its own", d)
		}
		return nil, fmt.Errorf("agent: locking %s: %w", d.path("run.lock"), err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
