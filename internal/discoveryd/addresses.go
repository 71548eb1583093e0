package discoveryd

import (
	"fmt"
	"net"
)

// CheckAddresses checks discovery's listen and advertise addresses as New
// does, without listening: muster discovery --check-config uses it.
func CheckAddresses(listen, advertise string) error {
	if listen == "" {
		listen = DefaultListen
	}
	if advertise != "" {
		if h, p, err := net.SplitHostPort(advertise); err != nil || h == "" || p == "" {
			return fmt.Errorf("discoveryd: advertise address %q: want HOST:PORT", advertise)
		}
	}
	return checkIssuerHost(listen, advertise)
}
