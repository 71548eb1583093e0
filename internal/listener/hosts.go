package listener

import (
	"net"
	"net/netip"
	"os"
)

// loopback are the names a client on the same machine uses.
var loopback = []string{"localhost", "127.0.0.1", "::1"}

// Hosts lists the hosts of a listener's addresses (HOST:PORT or a bare
// host: what it was asked to listen on, where it is bound, where it is
// advertised) for its certificate's DNS and IP SANs, each once, in order.
//
// An unspecified host (":7443", "0.0.0.0:7443", "[::]:7443") stands for
// every interface, so the machine's name and the loopback names stand for
// it. A loopback host (127.0.0.0/8, ::1, localhost) brings the loopback
// names too, as a client on the machine may use any of them. Any other
// host is listed alone: a certificate does not name loopback for a
// listener that cannot be reached there.
func Hosts(addrs ...string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(hs ...string) {
		for _, h := range hs {
			if h != "" && !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	for _, a := range addrs {
		if a == "" {
			continue
		}
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			h = a
		}
		ip := net.ParseIP(h)
		switch {
		case Unspecified(h):
			if name, err := os.Hostname(); err == nil {
				add(name)
			}
			add(loopback...)
		case h == "localhost" || ip != nil && ip.IsLoopback():
			add(h)
			add(loopback...)
		default:
			add(h)
		}
	}
	return out
}

// Unspecified reports whether host names no machine: empty, 0.0.0.0 or ::
// (IPv4-mapped included). A server bound there listens on every
// interface, but nobody can dial it by that name.
func Unspecified(host string) bool {
	ip, err := netip.ParseAddr(host)
	return host == "" || err == nil && ip.Unmap().IsUnspecified()
}
