package authority

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/listener"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// Shares of limits.max_connections, applied once a connection's TLS
// handshake has said who is calling. The listeners' Cap counts every
// connection from its accept, before anyone can be told apart; these keep
// whoever can hold connections without credentials, or with one agent's,
// from holding all of it:
//
//   - anonymous connections (no client certificate this authority issued:
//     joins, bootstraps, health checks, anyone) hold at most
//     anonymousShare of the cap, so the rest is kept for operators and for
//     agents' renewals and streams;
//   - one agent identity holds at most connsPerAgent connections (an
//     agent uses one for its stream and one for a renewal at a time);
//   - operators are not capped beyond the Cap itself.
//
// A connection past its share is counted in
// muster_connections_refused_total{reason="anonymous"|"identity"} and
// logged once a minute. An agent's is kept refusedLife (refusedPerAgent
// of them at a time) to answer its every call RESOURCE_EXHAUSTED with the
// cap and the way out (refusedInfo), which a connection closed after its
// handshake cannot tell a grpc-go client (it says only "error reading
// server preface: EOF"); it takes no place in the share. An anonymous one
// is closed at once: kept, a flood of them would hold the Cap's reserve.
const (
	anonymousShareNum, anonymousShareDen = 3, 4
	connsPerAgent                        = 8
)

// reserveHandshake is the time a connection has for its TLS handshake when
// it starts while as many handshakes as the anonymous share are under way
// (in the reserve): any client on a working network is done in well under
// a second, and a handshake that stalls there (a partial ClientHello, sent
// from however many sources) holds its place a second, not the
// handshakeTimeout of 10 s. Connections that say nothing at all make room
// on a full cap instead (listener.Cap.EvictSilent).
const reserveHandshake = time.Second

// errConnShare is the handshake's failure for a connection past its share
// closed at once.
var errConnShare = errors.New("authority: connection closed: its caller holds its share of the connection cap")

// refusedLife is how long a connection past its share is kept to answer
// its calls with the refusal: a client sends its first call at once, and
// meanwhile the connection holds its place in the listener's Cap, not in
// a share.
const refusedLife = 5 * time.Second

// refusedPerAgent is how many refused connections of one agent identity
// are kept at a time (refusedLife each) to tell it why: one is enough for
// its log; more are closed at once, so an identity cannot hold more than
// connsPerAgent+refusedPerAgent of the Cap.
const refusedPerAgent = 2

// refusedInfo is the AuthInfo of a connection past its share: authorize
// answers its calls with reason.
type refusedInfo struct {
	credentials.AuthInfo
	reason string
}

// shareRefusal is the refusal of a connection of agent (its node ID)
// past its share.
func shareRefusal(agent string) string {
	return fmt.Sprintf("connection refused: the agent %s holds %d connections to this authority already, the most one agent identity may hold (an agent uses one for its stream and one for a renewal): "+
		"another process uses this agent's identity (one agent process per identity: stop the other), or its earlier connections are still closing (the agent retries)", agent, connsPerAgent)
}

// connShares counts the connections open by class. Safe for concurrent use.
type connShares struct {
	anonMax int
	// startBy is how long after its handshake an accepted connection
	// keeps its place unless gRPC's transport starts on it (sharedConn).
	startBy time.Duration
	// handshaking counts the TLS handshakes under way.
	handshaking atomic.Int64

	mu     sync.Mutex
	anon   int
	agents map[string]int
	// refused counts, by agent, the refused connections kept to answer
	// their calls (keepRefused).
	refused map[string]int
}

// keepRefused takes one of agent's refusedPerAgent places for a refused
// connection kept to tell it why, and returns its release; false for an
// anonymous connection (none is kept) or when agent holds them all.
func (c *connShares) keepRefused(agent string) (func(), bool) {
	if agent == "" {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused[agent] >= refusedPerAgent {
		return nil, false
	}
	c.refused[agent]++
	return sync.OnceFunc(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.refused[agent]--; c.refused[agent] <= 0 {
			delete(c.refused, agent)
		}
	}), true
}

func newConnShares(maxConns int) *connShares {
	return &connShares{anonMax: max(maxConns*anonymousShareNum/anonymousShareDen, 1), startBy: handshakeTimeout,
		agents: map[string]int{}, refused: map[string]int{}}
}

// take counts one connection of agent (or, "", an anonymous one unless
// operator) and returns its release, or false past its share.
func (c *connShares) take(operator bool, agent string) (func(), listener.Refusal, bool) {
	if operator {
		return func() {}, "", true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if agent == "" {
		if c.anon >= c.anonMax {
			return nil, listener.RefusedAnonymous, false
		}
		c.anon++
		return sync.OnceFunc(func() { c.mu.Lock(); c.anon--; c.mu.Unlock() }), "", true
	}
	if c.agents[agent] >= connsPerAgent {
		return nil, listener.RefusedIdentity, false
	}
	c.agents[agent]++
	return sync.OnceFunc(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.agents[agent]--; c.agents[agent] <= 0 {
			delete(c.agents, agent)
		}
	}), "", true
}

// sharedCreds are a listener's TLS credentials that, once a handshake is
// done, take the connection's place in its caller's share (connShares).
type sharedCreds struct {
	credentials.TransportCredentials
	s       *Server
	refused func(listener.Refusal)
}

func (c sharedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	// gRPC set the handshake's deadline (handshakeTimeout) before this
	// call, and clears it once the HTTP/2 preface that follows is read.
	if n := c.s.shares.handshaking.Add(1); n > int64(c.s.shares.anonMax) {
		// Wall time, not the replica's clock: the socket's deadline is.
		raw.SetDeadline(time.Now().Add(reserveHandshake))
	}
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	c.s.shares.handshaking.Add(-1)
	if err != nil {
		return conn, info, err
	}
	var certs []*x509.Certificate
	if ti, ok := info.(credentials.TLSInfo); ok {
		certs = ti.State.PeerCertificates
	}
	// The connection's client-certificate check, made here first and
	// kept for its calls (connchain.go).
	var cc *connChain
	if len(certs) > 0 {
		cc = &connChain{}
	}
	operator, agent := c.s.connClass(cc, certs)
	release, why, ok := c.s.shares.take(operator, agent)
	if !ok {
		c.refused(why)
		free, kept := c.s.shares.keepRefused(agent)
		if !kept {
			// Anonymous (whoever can open connections would fill the
			// Cap's reserve with refused ones), or an agent that already
			// has refusedPerAgent being told: closed at once.
			conn.Close()
			return nil, nil, errConnShare
		}
		return keepRefusedConn(conn, free, refusedLife), refusedInfo{AuthInfo: info, reason: shareRefusal(agent)}, nil
	}
	if ti, ok := info.(credentials.TLSInfo); ok && cc != nil {
		info = &connAuthInfo{TLSInfo: ti, chain: cc}
	}
	return keepSharedConn(conn, release, c.s.shares.startBy), info, nil
}

func (c sharedCreds) Clone() credentials.TransportCredentials {
	return sharedCreds{TransportCredentials: c.TransportCredentials.Clone(), s: c.s, refused: c.refused}
}

// connClass tells a connection's caller from the certificate it presented:
// an operator, an agent (its node ID), or anonymous. A certificate that
// does not verify is anonymous here (authorize refuses it, with its
// reason, on the first call), so nobody can spend an agent's share with
// a certificate naming it. The check is kept in cc (nil: not kept) for
// the connection's calls.
func (s *Server) connClass(cc *connChain, certs []*x509.Certificate) (operator bool, agent string) {
	if len(certs) == 0 {
		return false, ""
	}
	// The replica's clock, as clientChain's check of the same chain on
	// the connection's calls: the two must class it alike.
	chain, err := s.verifyConnCerts(cc, certs, s.now())
	if err != nil || len(chain) < 2 {
		return false, ""
	}
	id, err := spiffeid.FromCertificate(chain[0])
	if err != nil || id.TrustDomain != s.info.TrustDomain {
		return false, ""
	}
	switch {
	case id.Role == spiffeid.RoleAdmin && s.acceptedIntermediate(ca.RoleAdmin, chain[1]):
		return true, ""
	case id.Role == spiffeid.RoleAgent && s.acceptedIntermediate(ca.RoleAgent, chain[1]):
		return false, id.Name
	}
	return false, ""
}

// acceptedIntermediate reports whether c is one of role's accepted
// intermediates (active, prepared or retiring), so leaves of a retiring
// one keep their class through a rotation.
func (s *Server) acceptedIntermediate(role ca.Role, c *x509.Certificate) bool {
	for _, a := range s.ca.Accepted(role) {
		if bytes.Equal(c.Raw, a.Raw) {
			return true
		}
	}
	return false
}

// sharedConn gives its place in its share back once: when it is closed,
// or, when gRPC's transport never started on it, startBy after the
// handshake. gRPC closes only the raw connection when its transport
// fails to start (writing its settings to a client that reset the
// connection just after the handshake: anyone can, anonymous or with an
// agent's certificate), never this wrapper, and a place given back only
// by its Close was held for good: enough of them and the share refused
// everyone. The transport starts by reading the client's preface through
// the wrapper; from that read on, every way it ends closes the wrapper.
type sharedConn struct {
	net.Conn
	started atomic.Bool
	stop    func() bool
	release func()
}

// keepSharedConn wraps conn, which holds a place in its share (release,
// called once), closed and its place freed at startBy unless a transport
// reads from it first.
func keepSharedConn(conn net.Conn, release func(), startBy time.Duration) *sharedConn {
	release = sync.OnceFunc(release)
	t := time.AfterFunc(startBy, func() {
		conn.Close()
		release()
	})
	return &sharedConn{Conn: conn, stop: t.Stop, release: release}
}

func (c *sharedConn) Read(b []byte) (int, error) {
	if c.started.CompareAndSwap(false, true) {
		c.stop()
	}
	return c.Conn.Read(b)
}

func (c *sharedConn) Close() error {
	c.stop()
	err := c.Conn.Close()
	c.release()
	return err
}

// refusedConn is a connection past its share kept to tell its client why:
// its timer is stopped when it closes first.
type refusedConn struct {
	net.Conn
	stop    func() bool
	release func()
}

// keepRefusedConn wraps conn, closed at the end of life whatever its
// client does (gRPC clears the socket's deadline after the handshake, so
// a timer), and frees its place (release, once) then or when it is
// closed first. The timer frees the place itself: when the transport
// fails to start after the handshake, gRPC closes only the raw
// connection, and a place given back only by gRPC closing the wrapper
// was held for good.
func keepRefusedConn(conn net.Conn, release func(), life time.Duration) *refusedConn {
	release = sync.OnceFunc(release)
	t := time.AfterFunc(life, func() {
		conn.Close()
		release()
	})
	return &refusedConn{Conn: conn, stop: t.Stop, release: release}
}

func (c *refusedConn) Close() error {
	c.stop()
	err := c.Conn.Close()
	c.release()
	return err
}
