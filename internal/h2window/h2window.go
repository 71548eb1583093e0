// Package h2window holds the one HTTP/2 flow-control window of every
// muster gRPC connection, the authority's side and its clients' (agents,
// muster bench's agents, discovery's clients): HTTP/2's default, 64 KiB,
// per stream and per connection, fixed.
//
// gRPC's default grows windows by estimating the bandwidth-delay product:
// the receiver of a call's first DATA frame answers it with a
// WINDOW_UPDATE and a PING, which the other side reads and acks with a
// write of its own, on every call and every task sent on a stream, so
// that bulk transfers fill a long link. muster makes none (a request is at
// most the authority's 64 KiB request limit, answers and tasks are a few
// KiB). Fixed, the window is also all a peer may send ahead on a
// connection, where estimation would let it grow to 16 MiB.
package h2window

import "google.golang.org/grpc"

// Size is the window, in bytes.
const Size = 65535

// DialOptions are a client connection's window options, to go beside its
// credentials.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(Size), grpc.WithStaticConnWindowSize(Size)}
}

// ServerOptions are a server's window options.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StaticStreamWindowSize(Size), grpc.StaticConnWindowSize(Size)}
}
