package postgres

import (
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"
)

// TestDialNoticesDeadPeers: the store's connections to the database give
// up on data unacknowledged for userTimeout (TCP_USER_TIMEOUT) rather than
// TCP's 15 minutes, and connecting is bounded by the store's timeout
// unless the URL says otherwise.
func TestDialNoticesDeadPeers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := pgconn.ParseConfig("postgres://u@" + ln.Addr().String() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	dialHungPeers(c, 7*time.Second)
	if c.ConnectTimeout != 7*time.Second {
		t.Errorf("connect timeout %s, want the store's 7s", c.ConnectTimeout)
	}
	conn, err := c.DialFunc(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ms, idle int
	var gerr error
	rc.Control(func(fd uintptr) {
		ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		if gerr == nil {
			idle, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		}
	})
	if gerr != nil {
		t.Fatal(gerr)
	}
	if ms != int(userTimeout.Milliseconds()) || idle != int(keepAliveIdle.Seconds()) {
		t.Errorf("TCP_USER_TIMEOUT %d ms, TCP_KEEPIDLE %d s; want %d ms, %d s", ms, idle, userTimeout.Milliseconds(), int(keepAliveIdle.Seconds()))
	}

	u, err := pgconn.ParseConfig("postgres://u@" + ln.Addr().String() + "/db?connect_timeout=3")
	if err != nil {
		t.Fatal(err)
	}
	dialHungPeers(u, 7*time.Second)
	if u.ConnectTimeout != 3*time.Second {
		t.Errorf("connect timeout %s, want the URL's 3s", u.ConnectTimeout)
	}
}
