//go:build unix

package listener

import (
	"net"
	"syscall"
)

// hasSent reports whether c's peer has sent bytes not read yet: a peek at
// the socket's receive queue that neither consumes nor waits. It goes
// through Control, not the read path, so a goroutine blocked reading c
// does not hold it up. Anything but a TCP connection, or a failed peek,
// reports false.
func hasSent(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var sent bool
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		sent = err == nil && n > 0
	})
	return sent
}
