package listener

import (
	"net"
	"syscall"
)

// TCP keep-alive as Go sets it on every connection it accepts by default:
// the first probe after 15 s without traffic, then every 15 s, the
// connection dropped after 9 unanswered. It is what frees the place of a
// peer that vanished (a powered-off agent holding its stream) within
// about 2.5 minutes, so it stays.
const (
	keepAliveIdle     = 15 // seconds
	keepAliveInterval = 15 // seconds
	keepAliveCount    = 9
)

// listenConfig sets TCP keep-alive once, on the listening socket: on Linux
// a connection accept(2) returns inherits the listening socket's options,
// so Go's four setsockopt(2) calls on each accepted connection
// (SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT) are not made
// (KeepAlive: -1). The connections keep the same settings
// (TestAcceptedConnectionsKeepAlive).
func listenConfig() *net.ListenConfig {
	return &net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = setKeepAlive(int(fd)) }); cerr != nil {
			return cerr
		}
		return err
	}}
}

func setKeepAlive(fd int) error {
	for _, o := range []struct{ level, opt, val int }{
		{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, keepAliveIdle},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, keepAliveInterval},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, keepAliveCount},
	} {
		if err := syscall.SetsockoptInt(fd, o.level, o.opt, o.val); err != nil {
			return err
		}
	}
	return nil
}
