//go:build !linux

package workload

import "net"

// Inherited finds no passed socket off Linux, where the Workload API is
// not served (PeerCredsSupported).
func Inherited(func(string) string, string) (net.Listener, error) { return nil, nil }

// UnsetListenEnv has nothing to unset off Linux.
func UnsetListenEnv() {}

// Differs has nothing to compare off Linux.
func Differs(Socket, bool) string { return "" }
