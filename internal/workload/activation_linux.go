package workload

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// listenFDsStart is the first descriptor systemd passes (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// Inherited returns the listening socket systemd passed to this process
// (socket activation, sd_listen_fds(3): LISTEN_PID, LISTEN_FDS and
// LISTEN_FDNAMES read with getenv), or nil when none was passed to it. The
// socket must be a listening Unix stream socket at path; with path empty
// (no Workload API configured) the one socket passed is taken, wherever
// it is. A socket that does not fit is refused, naming the fix. The
// listener returned never removes the socket's file: it is systemd's, and
// keeping it is what lets callers queue while the agent restarts.
func Inherited(getenv func(string) string, path string) (net.Listener, error) {
	return inherited(getenv, os.Getpid(), listenFDsStart, path)
}

// UnsetListenEnv removes the socket activation variables from the
// environment, so no child takes the sockets as passed to it.
func UnsetListenEnv() {
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(k)
	}
}

func inherited(getenv func(string) string, pid, first int, path string) (net.Listener, error) {
	fds := getenv("LISTEN_FDS")
	if fds == "" {
		return nil, nil
	}
	// Passed to another process (a parent that left them in the
	// environment): not ours to take.
	if p, err := strconv.Atoi(getenv("LISTEN_PID")); err != nil || p != pid {
		return nil, nil
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 1 || n > 64 {
		return nil, fmt.Errorf("workload api: LISTEN_FDS=%q: want the number of sockets systemd passed", fds)
	}
	names := strings.Split(getenv("LISTEN_FDNAMES"), ":")
	want := "a listening Unix stream socket"
	if path != "" {
		want += " at " + path
	}
	var (
		found   net.Listener
		seen    []string
		others  []int
		lastErr error
		// elsewhere is a passed socket that would do at another path.
		elsewhere string
	)
	for i := range n {
		fd := first + i
		// systemd passes them without close-on-exec.
		syscall.CloseOnExec(fd)
		at, err := describe(fd)
		name := ""
		if i < len(names) && names[i] != "" {
			name = " (" + names[i] + ")"
		}
		if err != nil {
			seen = append(seen, fmt.Sprintf("fd %d%s: %v", fd, name, err))
			others = append(others, fd)
			continue
		}
		if found != nil || !at.fits(path) {
			if at.fits("") {
				elsewhere = at.path
			}
			seen = append(seen, fmt.Sprintf("fd %d%s: %s", fd, name, at))
			others = append(others, fd)
			continue
		}
		f := os.NewFile(uintptr(fd), "LISTEN_FDS"+name)
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			lastErr = err
			seen = append(seen, fmt.Sprintf("fd %d%s: %v", fd, name, err))
			continue
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		found = l
	}
	// Sockets passed beside the one served would hold their callers for
	// ever; they are closed, so those callers are refused at once.
	for _, fd := range others {
		syscall.Close(fd)
	}
	if found != nil {
		return found, nil
	}
	if lastErr != nil {
		return nil, fmt.Errorf("workload api: the socket systemd passed: %w", lastErr)
	}
	fix := "set ListenStream=/run/muster/agent.sock in muster-agent.socket (systemctl edit muster-agent.socket), or go without it (systemctl mask --now muster-agent.socket)"
	if path != "" {
		fix = fmt.Sprintf("set ListenStream=%s in muster-agent.socket (systemctl edit muster-agent.socket)", path)
		if elsewhere != "" {
			fix += ", or serve the Workload API where the unit has it: --workload-api unix://" + elsewhere
		}
	}
	return nil, fmt.Errorf("workload api: the socket systemd passed is not %s (%s); %s", want, strings.Join(seen, "; "), fix)
}

// sockInfo is what a passed descriptor is.
type sockInfo struct {
	unix, stream, listening bool
	path                    string
}

func (s sockInfo) fits(path string) bool {
	return s.unix && s.stream && s.listening && s.path != "" && (path == "" || s.path == path)
}

func (s sockInfo) String() string {
	kind := "a non-Unix socket"
	if s.unix {
		kind = "a Unix datagram or sequential-packet socket"
		if s.stream {
			kind = "a Unix stream socket"
		}
	}
	if s.unix && s.stream && !s.listening {
		kind += " not listening"
	}
	if s.path != "" {
		kind += " at " + s.path
	} else if s.unix {
		kind += " without a path"
	}
	return kind
}

func describe(fd int) (sockInfo, error) {
	var s sockInfo
	domain, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_DOMAIN)
	if err != nil {
		return s, fmt.Errorf("not a socket: %w", err)
	}
	typ, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TYPE)
	if err != nil {
		return s, err
	}
	acc, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
	if err != nil {
		return s, err
	}
	s.unix, s.stream, s.listening = domain == syscall.AF_UNIX, typ == syscall.SOCK_STREAM, acc == 1
	if s.unix {
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			return s, err
		}
		if u, ok := sa.(*syscall.SockaddrUnix); ok && !strings.HasPrefix(u.Name, "@") {
			s.path = u.Name
		}
	}
	return s, nil
}

// Differs names the settings of want the socket at its path lacks, among
// those given explicitly (the mode when mode is set, UID and GID when not
// -1), or "" when it has them all: a socket systemd made has the mode and
// owner of its .socket unit, not the agent's settings.
func Differs(want Socket, mode bool) string {
	fi, err := os.Stat(want.Path)
	if err != nil {
		return err.Error()
	}
	var d []string
	if mode && fi.Mode().Perm() != want.Mode {
		d = append(d, fmt.Sprintf("mode %04o, not %04o (SocketMode=%04o)", fi.Mode().Perm(), want.Mode, want.Mode))
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && want.UID >= 0 && int(st.Uid) != want.UID {
		d = append(d, fmt.Sprintf("owner UID %d, not %d (SocketUser=)", st.Uid, want.UID))
	}
	if ok && want.GID >= 0 && int(st.Gid) != want.GID {
		d = append(d, fmt.Sprintf("group GID %d, not %d (SocketGroup=)", st.Gid, want.GID))
	}
	return strings.Join(d, ", ")
}
