package authority

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/callinfo"
	"github.com/muster-dev/muster/internal/requestcodec"
)

// A request body that cannot be read fails inside gRPC, before any
// interceptor runs, and gRPC writes the status itself: a body larger than
// maxRequestSize is RESOURCE_EXHAUSTED, one that is not a protobuf message
// INTERNAL, and neither was audited. Two pieces mend that:
//   - requestcodec reads muster's requests; one that does not parse is
//     kept aside instead of failing the read, and refused by
//     unaryAuth with INVALID_ARGUMENT after the caller is authorized;
//   - guarded wraps each method's handler: a read that fails anyway (too
//     large) is audited there, its code left as gRPC wrote it.
// Both refusals go through Refusals, aggregated under a flood.

// decodeKey marks, in a request's context, that its body did not parse.
type decodeKey struct{}

// guarded returns a copy of desc whose handlers note a request that did
// not parse in the context (for unaryAuth) and audit one that could not be
// read at all.
func (s *Server) guarded(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	out := *desc
	out.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		h, method := m.Handler, "/"+desc.ServiceName+"/"+m.MethodName
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			bad := new(bool)
			ctx = context.WithValue(ctx, decodeKey{}, bad)
			read := func(v any) error {
				err := dec(v)
				if requestcodec.Unparsed(v) {
					*bad = true
				}
				if c := status.Code(err); c == codes.ResourceExhausted || c == codes.Internal || c == codes.Unimplemented {
					s.refuseUnread(ctx, method, status.Convert(err).Message())
				}
				return err
			}
			return h(srv, ctx, read, in)
		}
		out.Methods[i] = m
	}
	// A stream reads many messages after the interceptor has run, so each
	// read is checked where it happens: every entry requestcodec records
	// is removed by the RecvMsg that caused it, and a stream cannot grow
	// its record.
	out.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, sd := range desc.Streams {
		h, method := sd.Handler, "/"+desc.ServiceName+"/"+sd.StreamName
		sd.Handler = func(srv any, ss grpc.ServerStream) error {
			return h(srv, &guardedStream{ServerStream: ss, s: s, method: method})
		}
		out.Streams[i] = sd
	}
	return &out
}

// guardedStream refuses, with INVALID_ARGUMENT and an audit record, a
// stream message that did not parse, and audits one gRPC could not read.
type guardedStream struct {
	grpc.ServerStream
	s      *Server
	method string
}

func (g *guardedStream) RecvMsg(m any) error {
	err := g.ServerStream.RecvMsg(m)
	if requestcodec.Unparsed(m) {
		g.s.refuseUnread(g.Context(), g.method, badMessage)
		return status.Error(codes.InvalidArgument, badMessage)
	}
	if c := status.Code(err); c == codes.ResourceExhausted || c == codes.Internal {
		g.s.refuseUnread(g.Context(), g.method, status.Convert(err).Message())
	}
	return err
}

// badMessage is the refusal of a request that does not parse.
const badMessage = "request is not a valid protobuf message for this method"

// unparsedRequest reports whether the request in ctx did not parse.
func unparsedRequest(ctx context.Context) bool {
	bad, _ := ctx.Value(decodeKey{}).(*bool)
	return bad != nil && *bad
}

// refuseUnread audits a request gRPC refused before muster could read it;
// the caller is not yet authorized, so it is named by its source alone.
func (s *Server) refuseUnread(ctx context.Context, method, reason string) {
	e := audit.Event{Actor: "anonymous", Action: "api.access", Target: method, Result: audit.ResultDenied,
		Reason: reason, CorrelationID: callinfo.CorrelationID(ctx)}
	if src := callinfo.Source(ctx); src.IsValid() {
		e.Source = src.String()
	}
	s.refusals.Record(ctx, e)
}

// unknownMethod answers a method or service the listener gs does not
// serve (UNIMPLEMENTED, in gRPC's own words, which clients recognise), and
// audits it.
func (s *Server) unknownMethod(gs *grpc.Server, ss grpc.ServerStream) error {
	method, _ := grpc.Method(ss.Context())
	reason := requestcodec.UnknownMethodReason(gs, method)
	return s.deny(ss.Context(), callerFrom(ss.Context()), method, codes.Unimplemented, reason)
}
