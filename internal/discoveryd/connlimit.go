package discoveryd

import (
	"net"
	"net/netip"

	"github.com/muster-dev/muster/internal/listener"
)

// listen binds one of discovery's listeners (name: api, metrics) with the
// caps on connections per source and in all: the api listener's from the
// open-file limit, the metrics listener's own small one. Each connection
// closed at once is counted and logged (rate-limited).
func (s *Server) listen(addr, name string, trusted []netip.Prefix) (net.Listener, error) {
	c := listener.NewCap(0)
	if name == "metrics" {
		c = listener.NewCap(listener.MetricsMaxConns)
	}
	return listener.Listen(addr, listener.Options{TrustedProxies: trusted, Cap: c, Refused: s.connRefusals.For(name, c.Max())})
}
