package listener

import (
	"net"
	"syscall"
	"testing"
)

// TestAcceptedConnectionsKeepAlive: TCP keep-alive is set once, on the
// listening socket, and every accepted connection has it with the same
// settings Go would have given it on accept (first probe after 15 s, then
// every 15 s, 9 probes), without a setsockopt(2) of its own.
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
