// Package requestcodec reads muster's gRPC requests so that one that does
// not parse reaches the server's own refusal. gRPC reads a unary request
// before any interceptor runs and answers a body that is not a protobuf
// message INTERNAL itself, unaudited and blaming the server; with this
// codec the read succeeds on an empty message, the message is noted, and
// the server's handler wrapper asks Unparsed right after the read, refuses
// it INVALID_ARGUMENT and audits it.
package requestcodec

import (
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec wrapped here
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// unparsed holds the requests Codec could not parse, from the read to the
// Unparsed call right after it in the same handler, which removes the
// entry: a server that calls Unparsed after every read cannot grow it.
var unparsed sync.Map // proto.Message -> struct{}

// Codec is gRPC's protobuf codec, but a muster request (a message of a
// "muster." package) that does not parse is recorded for Unparsed rather
// than failing the read. Messages of other packages (health, reflection)
// fail as before.
type Codec struct{ encoding.CodecV2 }

// New returns the codec, for grpc.ForceServerCodecV2.
func New() Codec { return Codec{encoding.GetCodecV2("proto")} }

// Unmarshal implements encoding.CodecV2.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if m, ok := v.(proto.Message); ok && err != nil &&
		strings.HasPrefix(string(m.ProtoReflect().Descriptor().FullName()), "muster.") {
		proto.Reset(m)
		unparsed.Store(m, struct{}{})
		return nil
	}
	return err
}

// Unparsed reports whether v, just read by Codec, did not parse, and
// forgets it.
func Unparsed(v any) bool {
	_, ok := unparsed.LoadAndDelete(v)
	return ok
}

// UnknownMethodReason is the refusal of method, which the server gs does
// not serve: the method of a service it serves, or the whole service.
func UnknownMethodReason(gs *grpc.Server, method string) string {
	svc, name, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok {
		return "unknown method"
	}
	if _, served := gs.GetServiceInfo()[svc]; served {
		return "unknown method " + name + " for service " + svc
	}
	return "unknown service " + svc
}
