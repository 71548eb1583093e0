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
