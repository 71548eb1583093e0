package workload

import (
	"context"
	"errors"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// Creds are a caller's Unix credentials as the kernel reports them for the
// socket (SO_PEERCRED): what it was when it connected, not what it claims.
type Creds struct {
	UID, GID uint32
	PID      int32
}

// authInfo carries the credentials (or why there are none) from the
// handshake to the interceptors.
type authInfo struct {
	credentials.CommonAuthInfo
	creds Creds
	err   error
}

func (authInfo) AuthType() string { return "unix-peercred" }

// peerTransport is the server's transport credentials: no encryption (a
// local socket), but each connection's peer credentials read at accept,
// and a cap on the connections one UID holds open, so no local user can
// take the descriptors every other caller needs.
type peerTransport struct {
	maxPerUID int
	refused   func(reason string, c *Creds, err error)

	mu    sync.Mutex
	conns map[uint32]int
}

func newPeerTransport(maxPerUID int, refused func(string, *Creds, error)) *peerTransport {
	return &peerTransport{maxPerUID: maxPerUID, refused: refused, conns: map[uint32]int{}}
}

var errTooManyConns = errors.New("workload api: too many connections of this UID")

func (t *peerTransport) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := authInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	c, err := peerCredsOf(conn)
	if err != nil {
		// Answered PERMISSION_DENIED by the first RPC.
		info.err = err
		return conn, info, nil
	}
	info.creds = c
	t.mu.Lock()
	if t.conns[c.UID] >= t.maxPerUID {
		t.mu.Unlock()
		t.refused("too_many_connections", &c, errTooManyConns)
		return nil, nil, errTooManyConns
	}
	t.conns[c.UID]++
	t.mu.Unlock()
	return &countedConn{Conn: conn, release: func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.conns[c.UID]--; t.conns[c.UID] <= 0 {
			delete(t.conns, c.UID)
		}
	}}, info, nil
}

func (t *peerTransport) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("workload api: server-side credentials only")
}

func (t *peerTransport) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "unix-peercred"}
}

func (t *peerTransport) Clone() credentials.TransportCredentials { return t }

//nolint:staticcheck // part of the interface
func (t *peerTransport) OverrideServerName(string) error { return nil }

// countedConn releases its UID's share once, when closed.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
