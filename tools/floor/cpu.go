package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// 100 on every Linux build Go runs on.
const clockTick = 10 * time.Millisecond

// cpuTimes is a process's user and system CPU time.
type cpuTimes struct{ user, sys time.Duration }

// parseStat reads utime and stime (fields 14 and 15) from the text of
// /proc/PID/stat. The command name (field 2) is in parentheses and may hold
// spaces and parentheses itself, so the fields are counted from the last
// ')'.
func parseStat(s string) (cpuTimes, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return cpuTimes{}, fmt.Errorf("stat %q: no ')'", s)
	}
	// After ')': field 3 (state) onwards.
	f := strings.Fields(s[i+1:])
	const utime = 14 - 3
	if len(f) <= utime+1 {
		return cpuTimes{}, fmt.Errorf("stat: %d fields after the command, want more than %d", len(f), utime+1)
	}
	u, err := strconv.ParseUint(f[utime], 10, 64)
	if err != nil {
		return cpuTimes{}, fmt.Errorf("stat utime: %w", err)
	}
	st, err := strconv.ParseUint(f[utime+1], 10, 64)
	if err != nil {
		return cpuTimes{}, fmt.Errorf("stat stime: %w", err)
	}
	return cpuTimes{user: time.Duration(u) * clockTick, sys: time.Duration(st) * clockTick}, nil
}

func readCPU(pid int) (cpuTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTimes{}, err
	}
	return parseStat(string(b))
}

// perOp is the server's CPU over a timed part divided among its ops.
type perOp struct {
	CPU, User, Sys time.Duration
	// UserShare is user time over user+system time.
	UserShare float64
	// Error is the most /proc's whole ticks can be off: each of utime and
	// stime is truncated to a tick at both readings, so their sum's
	// difference is within two ticks, over the ops.
	Error time.Duration
}

func cpuPerOp(before, after cpuTimes, ops int) (perOp, error) {
	if ops <= 0 {
		return perOp{}, fmt.Errorf("no successful ops to divide the CPU among")
	}
	user, sys := after.user-before.user, after.sys-before.sys
	if user < 0 || sys < 0 {
		return perOp{}, fmt.Errorf("CPU went backwards (%v to %v): another process?", before, after)
	}
	p := perOp{
		CPU:   (user + sys) / time.Duration(ops),
		User:  user / time.Duration(ops),
		Sys:   sys / time.Duration(ops),
		Error: 2 * clockTick / time.Duration(ops),
	}
	if user+sys > 0 {
		p.UserShare = float64(user) / float64(user+sys)
	}
	return p, nil
}
