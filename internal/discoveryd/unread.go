package discoveryd

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/requestcodec"
)

// A request gRPC refuses before a handler runs (a body over
// MaxRequestSize, one that is not a protobuf message, an unknown method)
// is refused by gRPC itself; these audit it, through the flood guard, as
// the handlers audit their own refusals.

// badMessage is the refusal of a request that does not parse.
const badMessage = "request is not a valid protobuf message for this method; use a muster client of this discovery's version"

// guarded returns a copy of desc whose handlers audit a request that
// could not be read. One that does not parse (requestcodec) is answered
// INVALID_ARGUMENT (gRPC would say INTERNAL, which blames the server); a
// too large one keeps gRPC's RESOURCE_EXHAUSTED, which gRPC answers
// before the record is written.
func (s *Server) guarded(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	out := *desc
	out.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		h, method := m.Handler, "/"+desc.ServiceName+"/"+m.MethodName
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			read := func(v any) error {
				err := dec(v)
				if requestcodec.Unparsed(v) {
					err = status.Error(codes.InvalidArgument, badMessage)
				}
				if err != nil {
					s.refuseUnread(ctx, method, status.Convert(err).Message())
				}
				return err
			}
			return h(srv, ctx, read, in)
		}
		out.Methods[i] = m
	}
	return &out
}

// refuseUnread audits a request refused before a handler read it.
func (s *Server) refuseUnread(ctx context.Context, method, reason string) {
	c := s.newCall(ctx, method)
	s.refusals.Record(ctx, audit.Event{Actor: "anonymous", Action: "api.access", Target: method, Result: audit.ResultDenied,
		Reason: reason, Source: c.src(), CorrelationID: c.correlationID})
}

// unknownMethod answers a method or service discovery does not serve
// (UNIMPLEMENTED, in gRPC's words, which clients recognise), and audits it.
func (s *Server) unknownMethod(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.Method(ss.Context())
	reason := requestcodec.UnknownMethodReason(s.grpc, method)
	s.refuseUnread(ss.Context(), method, reason)
	return status.Error(codes.Unimplemented, reason)
}
