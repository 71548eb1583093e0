package listener

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
)

// ParseTrustedProxies reads addresses and CIDR ranges of the TCP load
// balancers allowed to say where a connection came from.
func ParseTrustedProxies(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: want an IP address or a CIDR range", s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// proxyHeaderTimeout bounds how long a trusted proxy may take to send its
// PROXY header.
const proxyHeaderTimeout = 5 * time.Second

// withTrustedProxies makes connections from a trusted proxy carry the
// client address from their PROXY protocol header (v1 or v2). A connection
// from anywhere else is taken as it is: its bytes are never read as a
// header, so nobody outside the trusted ranges can claim another source.
func withTrustedProxies(lis net.Listener, trusted []netip.Prefix) net.Listener {
	if len(trusted) == 0 {
		return lis
	}
	return &proxyproto.Listener{
		Listener:          lis,
		ReadHeaderTimeout: proxyHeaderTimeout,
		ConnPolicy: func(o proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
			if isTrusted(o.Upstream, trusted) {
				// USE, not REQUIRE: a balancer's own health checks may
				// come without a header.
				return proxyproto.USE, nil
			}
			return proxyproto.SKIP, nil
		},
	}
}

func isTrusted(addr net.Addr, trusted []netip.Prefix) bool {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return false
	}
	ip, ok := netip.AddrFromSlice(tcp.IP)
	if !ok {
		return false
	}
	ip = ip.Unmap()
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
