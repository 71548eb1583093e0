//go:build !unix

package listener

import "net"

// hasSent cannot peek here: a connection counts as silent until its first
// byte is read.
func hasSent(net.Conn) bool { return false }
