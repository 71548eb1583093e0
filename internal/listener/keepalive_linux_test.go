package listener

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// TestAcceptedConnectionsKeepAlive: TCP keep-alive is set once, on the
// listening socket, and every accepted connection has it with the same
// settings Go would have given it on accept (first probe after 15 s, then
// every 15 s, 9 probes), without a setsockopt(2) of its own, and the user
// timeout of the same 150 s.
func TestAcceptedConnectionsKeepAlive(t *testing.T) {
	lis, err := listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	check := func(what string, c syscall.Conn) {
		t.Helper()
		raw, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []struct {
			name       string
			level, opt int
			want       int
		}{
			{"SO_KEEPALIVE", syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
			{"TCP_KEEPIDLE", syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, 15},
			{"TCP_KEEPINTVL", syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, 15},
			{"TCP_KEEPCNT", syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, 9},
			{"TCP_USER_TIMEOUT", syscall.IPPROTO_TCP, tcpUserTimeout, 150_000},
		} {
			var got int
			var gerr error
			if err := raw.Control(func(fd uintptr) { got, gerr = syscall.GetsockoptInt(int(fd), o.level, o.opt) }); err != nil {
				t.Fatal(err)
			}
			if gerr != nil {
				t.Fatalf("%s: %s: %v", what, o.name, gerr)
			}
			if got != o.want {
				t.Errorf("%s: %s = %d, want %d", what, o.name, got, o.want)
			}
		}
	}
	check("listening socket", lis.(*net.TCPListener))

	client, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	check("accepted connection", c.(*net.TCPConn))
}

// TestStalledReaderEndsWrite: a peer that stops reading, its receive
// window closed while it still answers the kernel's probes, fails the
// server's write once the user timeout passes (here 500 ms), rather than
// holding it for good (RFC 1122's default, and Linux's without
// TCP_USER_TIMEOUT).
func TestStalledReaderEndsWrite(t *testing.T) {
	lc := net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = setKeepAlive(int(fd), 500) }); cerr != nil {
			return cerr
		}
		return err
	}}
	lis, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
	}}
	client, err := d.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close() // never read
	c, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wrote := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for range 1 << 14 { // 1 GiB
			if _, err := c.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("1 GiB written to a peer that read nothing")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a write to a peer that read nothing still waited after 30 s")
	}
}
