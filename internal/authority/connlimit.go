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
// metrics) with the caps on connections per source and in all: the api
// and bootstrap listeners share one Cap of limits.max_connections (they
// draw on one table of descriptors), the metrics listener has its own
// small one. Each connection closed at once is counted and logged
// (rate-limited).
func (s *Server) listen(addr, name string, trusted []netip.Prefix) (net.Listener, error) {
	c := s.conns
	if name == "metrics" {
		c = listener.NewCap(listener.MetricsMaxConns)
	}
	return listener.Listen(addr, listener.Options{TrustedProxies: trusted, Cap: c, Refused: s.connRefusals.For(name, c.Max())})
}
