//go:build !linux

package workload

import (
	"errors"
	"net"
)

// PeerCredsSupported reports whether callers' credentials can be read
// here (SO_PEERCRED): only on Linux, so elsewhere every caller is refused.
const PeerCredsSupported = false

func peerCredsOf(net.Conn) (Creds, error) {
	return Creds{}, errors.New("caller credentials (SO_PEERCRED) are read on Linux only")
}
