package discoveryd

import (
	"net"
	"net/netip"

	"github.com/muster-dev/muster/internal/listener"
)

// listen binds one of discovery's listeners (name: api, metrics) with the
// caps on connections per source and in all (the default from the
// open-file limit); each connection closed at once is counted and logged
// (rate-limited).
func (s *Server) listen(addr, name string, trusted []netip.Prefix) (net.Listener, error) {
	n := listener.DefaultMaxConns()
	return listener.Listen(addr, listener.Options{TrustedProxies: trusted, MaxConns: n, Refused: s.connRefusals.For(name, n)})
}
