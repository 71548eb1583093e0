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

// ProcessCPU is the CPU time this process has used, every thread's (user
// and system), for a benchmark that compares its own CPU per operation
// with a bound; zero where it cannot be read.
func ProcessCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
