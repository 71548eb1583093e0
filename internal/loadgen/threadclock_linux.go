//go:build linux

package loadgen

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadClock is the CPU time the calling thread has used: the bound's
// rounds run locked to one thread, so time other processes take on the
// machine is not counted in them. Wall time if the clock cannot be read.
func threadClock() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return time.Duration(time.Now().UnixNano())
	}
	return time.Duration(ts.Nano())
}
