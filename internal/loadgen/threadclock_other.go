//go:build !linux

package loadgen

import "time"

// threadClock is wall time where no thread CPU clock is read: the best of
// the rounds then keeps the least disturbed one.
func threadClock() time.Duration { return time.Duration(time.Now().UnixNano()) }

// ProcessCPU is zero where the process's CPU clock is not read: a
// benchmark then reports no CPU figures.
func ProcessCPU() time.Duration { return 0 }
