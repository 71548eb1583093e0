package workload

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// passFDs puts a copy of each socket's descriptor at consecutive free
// numbers, as systemd lays them out from 3, and returns the first: what
// inherited takes ownership of.
func passFDs(t *testing.T, socks ...syscall.Conn) int {
	t.Helper()
	first := 500
	for ; ; first += len(socks) {
		free := true
		for i := range socks {
			if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(first+i), syscall.F_GETFD, 0); e != syscall.EBADF {
				free = false
			}
		}
		if free {
			break
		}
	}
	for i, s := range socks {
		rc, err := s.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var dupErr error
		if err := rc.Control(func(fd uintptr) { dupErr = syscall.Dup3(int(fd), first+i, 0) }); err != nil || dupErr != nil {
			t.Fatal(err, dupErr)
		}
	}
	return first
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// A socket systemd passes (sd_listen_fds: LISTEN_PID, LISTEN_FDS) is served
// only if it is a listening Unix stream socket at the path asked for (or,
// with none asked for, wherever it is); anything else is refused naming the
// unit to change. Closing the listener leaves the socket's file, systemd's.
func TestInheritedSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "act")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pid := os.Getpid()
	n := 0
	unixListener := func(t *testing.T) (*net.UnixListener, string) {
		n++
		p := filepath.Join(dir, "s"+strconv.Itoa(n))
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		t.Cleanup(func() { l.Close() })
		return l, p
	}
	vars := func(pid, fds int) map[string]string {
		return map[string]string{"LISTEN_PID": strconv.Itoa(pid), "LISTEN_FDS": strconv.Itoa(fds), "LISTEN_FDNAMES": "muster-agent.socket"}
	}

	t.Run("served", func(t *testing.T) {
		l, p := unixListener(t)
		lis, err := inherited(env(vars(pid, 1)), pid, passFDs(t, l), p)
		if err != nil || lis == nil {
			t.Fatalf("a listening Unix stream socket at the path: %v %v", lis, err)
		}
		c, err := net.Dial("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		a, err := lis.Accept()
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		lis.Close()
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("closing the passed socket removed its file: %v", err)
		}
	})
	t.Run("no path asked: the unit's taken", func(t *testing.T) {
		l, p := unixListener(t)
		lis, err := inherited(env(vars(pid, 1)), pid, passFDs(t, l), "")
		if err != nil || lis == nil || lis.Addr().String() != p {
			t.Fatalf("no path asked for: %v %v", lis, err)
		}
		lis.Close()
	})
	t.Run("the served one among several", func(t *testing.T) {
		other, _ := unixListener(t)
		l, p := unixListener(t)
		lis, err := inherited(env(vars(pid, 2)), pid, passFDs(t, other, l), p)
		if err != nil || lis == nil || lis.Addr().String() != p {
			t.Fatalf("two passed, one at the path: %v %v", lis, err)
		}
		lis.Close()
	})
	for _, tc := range []struct {
		name string
		vars func(first int) map[string]string
	}{
		{"none passed", func(int) map[string]string { return map[string]string{} }},
		{"passed to another process", func(int) map[string]string { return vars(pid+1, 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, p := unixListener(t)
			first := passFDs(t, l)
			defer syscall.Close(first)
			lis, err := inherited(env(tc.vars(first)), pid, first, p)
			if lis != nil || err != nil {
				t.Fatalf("got %v %v, want nothing taken", lis, err)
			}
			if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(first), syscall.F_GETFD, 0); e != 0 {
				t.Fatalf("a descriptor not passed to this process was closed: %v", e)
			}
		})
	}

	refused := []struct {
		name string
		sock func(t *testing.T) syscall.Conn
		fds  string
		want string
	}{
		{"another path", func(t *testing.T) syscall.Conn { l, _ := unixListener(t); return l }, "1", "a Unix stream socket at " + dir},
		{"TCP", func(t *testing.T) syscall.Conn {
			l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return l
		}, "1", "a non-Unix socket"},
		{"datagram", func(t *testing.T) syscall.Conn {
			c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "dgram"), Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}, "1", "a Unix datagram"},
		{"not listening", func(t *testing.T) syscall.Conn {
			_, p := unixListener(t)
			c, err := net.Dial("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c.(*net.UnixConn)
		}, "1", "not listening"},
		{"a bad count", func(t *testing.T) syscall.Conn { l, _ := unixListener(t); return l }, "x", `LISTEN_FDS="x"`},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			want := filepath.Join(dir, "agent.sock")
			first := passFDs(t, tc.sock(t))
			v := vars(pid, 1)
			v["LISTEN_FDS"] = tc.fds
			lis, err := inherited(env(v), pid, first, want)
			if tc.fds != "1" {
				syscall.Close(first)
			}
			if lis != nil || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want a refusal naming %q", lis, err, tc.want)
			}
			if testing.Verbose() {
				t.Log(err)
			}
			if tc.fds == "1" && !strings.Contains(err.Error(), "ListenStream="+want) {
				t.Errorf("the refusal names no fix: %v", err)
			}
		})
	}
}
