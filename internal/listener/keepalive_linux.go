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

// userTimeout (TCP_USER_TIMEOUT) is as long as keep-alive takes to drop
// a vanished peer, and bounds what keep-alive does not see: data the
// peer leaves unacknowledged, or a zero receive window it keeps
// advertising while answering the kernel's probes (RFC 1122 would keep
// such a connection open for good). Without it a client that stopped
// reading held the server's write, and with it a gRPC connection's
// writer (every call on it), until gRPC's own keep-alive (two hours) or
// longer; with it the kernel fails the write and closes the connection.
const userTimeout = (keepAliveIdle + keepAliveInterval*keepAliveCount) * 1000 // milliseconds

// tcpUserTimeout is TCP_USER_TIMEOUT (linux/tcp.h), which package
// syscall does not name.
const tcpUserTimeout = 0x12

// listenConfig sets TCP keep-alive once, on the listening socket: on Linux
// a connection accept(2) returns inherits the listening socket's options,
// so Go's four setsockopt(2) calls on each accepted connection
// (SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT) are not made
// (KeepAlive: -1). The connections keep the same settings
// (TestAcceptedConnectionsKeepAlive).
func listenConfig() *net.ListenConfig {
	return &net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = setKeepAlive(int(fd), userTimeout) }); cerr != nil {
			return cerr
		}
		return err
	}}
}

// setKeepAlive sets keep-alive and a user timeout of userTimeoutMs on
// the socket fd.
func setKeepAlive(fd, userTimeoutMs int) error {
	for _, o := range []struct{ level, opt, val int }{
		{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, keepAliveIdle},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, keepAliveInterval},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, keepAliveCount},
		{syscall.IPPROTO_TCP, tcpUserTimeout, userTimeoutMs},
	} {
		if err := syscall.SetsockoptInt(fd, o.level, o.opt, o.val); err != nil {
			return err
		}
	}
	return nil
}
