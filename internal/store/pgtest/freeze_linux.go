package pgtest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Freeze stops every process of the cluster (SIGSTOP), the postmaster and
// each backend: a database that hangs rather than refusing, as a server
// stalled on its storage or a network path that keeps connections but
// forwards nothing does. The kernel still accepts connections and
// acknowledges data; nothing is answered. Thaw undoes it; Stop needs it
// undone first.
func (s *Server) Freeze() error { return s.signalAll(syscall.SIGSTOP) }

// Thaw continues the processes Freeze stopped (SIGCONT).
func (s *Server) Thaw() error { return s.signalAll(syscall.SIGCONT) }

// signalAll sends sig to the postmaster and to its children. The
// postmaster is signalled first when stopping, so it forks nothing new
// meanwhile, and last when continuing.
func (s *Server) signalAll(sig syscall.Signal) error {
	pid, err := s.postmaster()
	if err != nil {
		return err
	}
	kids, err := children(pid)
	if err != nil {
		return err
	}
	pids := append([]int{pid}, kids...)
	if sig == syscall.SIGCONT {
		pids = append(kids, pid)
	}
	for _, p := range pids {
		if err := syscall.Kill(p, sig); err != nil && err != syscall.ESRCH {
			return fmt.Errorf("signal %d: %w", p, err)
		}
	}
	return nil
}

// postmaster reads the postmaster's PID from postmaster.pid.
func (s *Server) postmaster() (int, error) {
	f, err := os.Open(filepath.Join(s.data(), "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, fmt.Errorf("postmaster.pid: empty")
	}
	return strconv.Atoi(strings.TrimSpace(sc.Text()))
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		rest := string(stat)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out, nil
}
