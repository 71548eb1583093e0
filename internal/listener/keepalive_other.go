//go:build !linux

package listener

import "net"

// listenConfig leaves TCP keep-alive to Go, which sets it on every
// accepted connection (first probe after 15 s; keepalive_linux.go).
func listenConfig() *net.ListenConfig {
	return &net.ListenConfig{}
}
