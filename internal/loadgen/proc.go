package loadgen

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ProcUsage is what the authority's process used during a run, read from
// /proc: CPU time (user and system) and the largest resident set seen.
type ProcUsage struct {
	PID        int     `json:"pid"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// Cores is CPU seconds per second of the run: 2.0 is two cores busy.
	Cores float64 `json:"cores"`
	// PeakRSSBytes is the largest VmRSS sampled every 100 ms.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// CPUPerRequest is the authority's CPU time per successful request:
	// unlike throughput, it hardly changes when other work shares the
	// machine, so it is the figure to compare with the bound there.
	CPUPerRequest time.Duration `json:"cpu_per_request_ns"`
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports, whatever the kernel's HZ.
const clockTicks = 100

type procWatch struct {
	pid      int
	cpuStart float64
	mu       sync.Mutex
	peak     int64
	done     chan struct{}
	stopped  chan struct{}
}

// watchIf watches pid, or nothing when pid is 0 (the authority is not on
// this machine): a nil watch.
func watchIf(pid int) (*procWatch, error) {
	if pid <= 0 {
		return nil, nil
	}
	return watchProc(pid)
}

func watchProc(pid int) (*procWatch, error) {
	cpu, err := procCPU(pid)
	if err != nil {
		return nil, err
	}
	w := &procWatch{pid: pid, cpuStart: cpu, done: make(chan struct{}), stopped: make(chan struct{})}
	w.sample()
	go func() {
		defer close(w.stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-tick.C:
				w.sample()
			}
		}
	}()
	return w, nil
}

func (w *procWatch) sample() {
	if rss, err := procRSS(w.pid); err == nil {
		w.mu.Lock()
		w.peak = max(w.peak, rss)
		w.mu.Unlock()
	}
}

func (w *procWatch) stop(elapsed time.Duration) (*ProcUsage, error) {
	close(w.done)
	<-w.stopped
	w.sample()
	cpu, err := procCPU(w.pid)
	if err != nil {
		return nil, fmt.Errorf("loadgen: the authority (pid %d) during the run: %w", w.pid, err)
	}
	u := &ProcUsage{PID: w.pid, CPUSeconds: cpu - w.cpuStart, PeakRSSBytes: w.peak}
	if elapsed > 0 {
		u.Cores = u.CPUSeconds / elapsed.Seconds()
	}
	return u, nil
}

// procCPU is the user and system CPU seconds pid has used.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime and stime, fields 14 and 15 of /proc/PID/stat.
// The command name (field 2) is in parentheses and may hold spaces and
// parentheses, so fields are counted from the last ')'.
func parseStatCPU(b []byte) (float64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("loadgen: /proc stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14.
	if len(f) < 13 {
		return 0, fmt.Errorf("loadgen: /proc stat: %d fields after the name", len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("loadgen: /proc stat: utime %q, stime %q", f[11], f[12])
	}
	return float64(ut+st) / clockTicks, nil
}

// procRSS is pid's resident set in bytes (VmRSS of /proc/PID/status).
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("loadgen: /proc status VmRSS %q", strings.TrimSpace(v))
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("loadgen: /proc status has no VmRSS")
}

// ProcOpenFiles is pid's soft limit of open files ("Max open files" of
// /proc/PID/limits); 0 with no error when it is unlimited.
func ProcOpenFiles(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	return parseOpenFiles(b)
}

func parseOpenFiles(b []byte) (uint64, error) {
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			if f[0] == "unlimited" {
				return 0, nil
			}
			return strconv.ParseUint(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("loadgen: /proc limits has no \"Max open files\"")
}
