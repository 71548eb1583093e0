package authority

import (
	"net"
	"net/netip"

	"github.com/muster-dev/muster/internal/listener"
)

// MaxConnections is limits.max_connections in force for a configured
// value: the value, or for 0 (not set) listener.DefaultMaxConns, from the
// process's open-file limit. --check-config prints what this returns.
func MaxConnections(configured int) int {
	if configured > 0 {
		return configured
	}
	return listener.DefaultMaxConns()
}

// listen binds one of the authority's listeners (name: api, bootstrap,
// metrics) with the caps on connections per source and in all; each
// connection closed at once is counted and logged (rate-limited).
func (s *Server) listen(addr, name string, trusted []netip.Prefix) (net.Listener, error) {
	n := MaxConnections(s.cfg.MaxConnections)
	return listener.Listen(addr, listener.Options{TrustedProxies: trusted, MaxConns: n, Refused: s.connRefusals.For(name, n)})
}
