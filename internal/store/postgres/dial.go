package postgres

import (
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// How soon a connection notices a database host that is gone (powered off,
// cut off by the network) rather than refusing: TCP's defaults give up on
// unacknowledged data after some 15 minutes of retransmissions, and Go's
// keepalives on an idle connection after 2.5 minutes, so the leader's lock
// and the change listener, idle for hours, held on to a dead peer.
// A server that is alive but stopped answering (its processes stopped, a
// proxy that accepts and forwards nothing) still acknowledges every packet:
// only the store's request deadline (deadline.go) catches that.
const (
	keepAliveIdle     = 10 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveCount    = 3
	// userTimeout: sent data unacknowledged this long ends the connection
	// (TCP_USER_TIMEOUT, Linux).
	userTimeout = 20 * time.Second
)

// dialHungPeers makes c's TCP connections notice a dead peer in seconds
// (keepalives and TCP_USER_TIMEOUT), and bounds connecting by timeout
// unless c already has a connect timeout (the URL's connect_timeout, which
// ParseConfig read).
func dialHungPeers(c *pgconn.Config, timeout time.Duration) {
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = timeout
	}
	d := &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount},
		Control: func(network, _ string, rc syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil
			}
			return setUserTimeout(rc, userTimeout)
		},
	}
	c.DialFunc = d.DialContext
}
