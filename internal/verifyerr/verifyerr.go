// Package verifyerr carries why a client refused a server's certificate
// past gRPC. A call whose connection failed its TLS handshake gets only
// the text of the reason, in an UNAVAILABLE status: the error the client's
// VerifyConnection returned, with its type, is lost in the transport, so a
// caller could tell a certificate that does not chain to the roots it
// pins from any other failure only by reading the text, which any other
// error (a server's refusal, a proxy's page) can imitate. Watch keeps the
// verification's error beside the connection and attaches it to the
// error of the calls that then fail UNAVAILABLE, for errors.As, the
// status (code, message, details) unchanged.
package verifyerr

import (
	"context"
	"crypto/tls"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Watch returns a copy of tc whose VerifyConnection remembers its last
// refusal, until a handshake verifies again, and the dial options that
// attach that refusal to every call's UNAVAILABLE error: a unary call's, a
// stream's when it opens, sends or receives. Use both on one connection.
// A tc without VerifyConnection is returned as it is, with no options.
func Watch(tc *tls.Config) (*tls.Config, []grpc.DialOption) {
	if tc.VerifyConnection == nil {
		return tc, nil
	}
	w := &watch{}
	tc = tc.Clone()
	verify := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		err := verify(cs)
		w.mu.Lock()
		w.refused = err
		w.mu.Unlock()
		return err
	}
	return tc, []grpc.DialOption{grpc.WithChainUnaryInterceptor(w.unary), grpc.WithChainStreamInterceptor(w.stream)}
}

// watch is one connection's last verification refusal. Safe for
// concurrent use.
type watch struct {
	mu      sync.Mutex
	refused error
}

// attach returns err with the last refusal attached when err is a call's
// UNAVAILABLE (the transport's failure to connect), the last handshake
// was refused, and err tells that refusal; err as it is otherwise.
func (w *watch) attach(err error) error {
	if err == nil || status.Code(err) != codes.Unavailable {
		return err
	}
	w.mu.Lock()
	refused := w.refused
	w.mu.Unlock()
	if refused == nil {
		return err
	}
	// The refusal stays until a handshake verifies again, so a later
	// failure that never reached a handshake (the port closed, the name
	// gone) would otherwise carry it too: attach it only to the failure
	// whose text is that refusal's.
	st := status.Convert(err)
	if !tells(st.Message(), refused) {
		return err
	}
	return &Error{err: err, status: st, Refused: refused}
}

func (w *watch) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return w.attach(invoker(ctx, method, req, reply, cc, opts...))
}

func (w *watch) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, w.attach(err)
	}
	return &stream{ClientStream: cs, w: w}, nil
}

type stream struct {
	grpc.ClientStream
	w *watch
}

func (s *stream) SendMsg(m any) error { return s.w.attach(s.ClientStream.SendMsg(m)) }
func (s *stream) RecvMsg(m any) error { return s.w.attach(s.ClientStream.RecvMsg(m)) }

// tells reports whether msg, a failed call's status message, gives
// refused's text: as it is, or quoted as gRPC quotes a transport's error
// ("connection error: desc = %q").
func tells(msg string, refused error) bool {
	text := refused.Error()
	quoted := strconv.Quote(text)
	return strings.Contains(msg, text) || strings.Contains(msg, quoted[1:len(quoted)-1])
}

// Error is a call's error whose connection was refused by the client's
// own verification of the server: the call's status as gRPC gave it
// (status.FromError and errinfo read it unchanged), and Refused, what
// VerifyConnection returned, which errors.As and errors.Is reach.
type Error struct {
	err     error
	status  *status.Status
	Refused error
}

func (e *Error) Error() string              { return e.err.Error() }
func (e *Error) GRPCStatus() *status.Status { return e.status }
func (e *Error) Unwrap() []error            { return []error{e.err, e.Refused} }
