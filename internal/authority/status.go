package authority

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// invalidArgument marks a request the handler itself found malformed.
type invalidArgument struct{ msg string }

func (e invalidArgument) Error() string { return e.msg }

func badRequest(msg string) error { return invalidArgument{msg} }

var refusalCodes = map[enroll.Kind]codes.Code{
	enroll.KindInvalid:            codes.InvalidArgument,
	enroll.KindRateLimited:        codes.ResourceExhausted,
	enroll.KindNotFound:           codes.NotFound,
	enroll.KindFailedPrecondition: codes.FailedPrecondition,
	enroll.KindPermissionDenied:   codes.PermissionDenied,
	enroll.KindAlreadyExists:      codes.AlreadyExists,
	enroll.KindUnauthenticated:    codes.Unauthenticated,
	enroll.KindUnavailable:        codes.Unavailable,
}

// toStatus is the one place where errors become gRPC status codes. Domain
// and store errors carry meaning through sentinels; anything unrecognised is
// an internal error whose detail goes to the log, never to the caller.
func toStatus(ctx context.Context, log *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var ia invalidArgument
	var ref *enroll.Refusal
	switch {
	case errors.As(err, &ref):
		return status.Error(refusalCodes[ref.Kind], ref.Reason)
	case errors.As(err, &ia):
		return status.Error(codes.InvalidArgument, ia.msg)
	case errors.Is(err, ca.ErrBadCSR), errors.Is(err, ca.ErrKeyType), errors.Is(err, spiffeid.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.As(err, new(*signer.TimesError)):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, signer.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case signer.IsRule(err):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, store.ErrNotFound):
		return status.Error(codes.NotFound, "not found")
	case errors.Is(err, store.ErrConflict):
		return status.Error(codes.AlreadyExists, "already exists")
	case errors.Is(err, store.ErrUnavailable):
		// A full disk passes; the agent retries UNAVAILABLE, not INTERNAL.
		log.Error("store unavailable", "err", err, "correlation_id", callerFrom(ctx).CorrelationID)
		return status.Error(codes.Unavailable, "the authority cannot write to its store now; retry later")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	c := callerFrom(ctx)
	log.Error("request failed", "err", err, "correlation_id", c.CorrelationID)
	return status.Errorf(codes.Internal, "internal error (correlation id %s)", c.CorrelationID)
}
