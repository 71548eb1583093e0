package discoveryd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// refusal is a request refused for a reason its caller may read. reason is
// a bounded label (metrics, the start of the message); msg is the message.
// audit, when set, is what the audit record says instead of msg: what
// discovery's operator may read but an anonymous caller may not (withAudit).
type refusal struct {
	code   codes.Code
	reason string
	msg    string
	audit  string
}

// withAudit sets what the audit record of r says instead of its message.
func (r *refusal) withAudit(format string, a ...any) *refusal {
	r.audit = fmt.Sprintf(format, a...)
	return r
}

func (r *refusal) Error() string { return r.msg }

func refuse(code codes.Code, reason, format string, a ...any) *refusal {
	return &refusal{code: code, reason: reason, msg: fmt.Sprintf(format, a...)}
}

// toStatus is the one place where errors become gRPC status codes.
// Refusals carry their code; anything else is an internal error whose
// detail goes to the log, never to the caller.
func toStatus(log *slog.Logger, method, correlationID string, err error) error {
	if err == nil {
		return nil
	}
	var r *refusal
	switch {
	case errors.As(err, &r):
		return status.Error(r.code, r.msg)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	log.Error("request failed", "method", method, "err", err, "correlation_id", correlationID)
	return status.Errorf(codes.Internal, "internal error (correlation id %s)", correlationID)
}
