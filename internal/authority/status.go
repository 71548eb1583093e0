package authority

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/enroll"
	"github.com/muster-dev/muster/internal/errinfo"
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
	enroll.KindDeadlineExceeded:   codes.DeadlineExceeded,
}

// refusalCode are the codes of refusals: the caller asked for something
// the authority will not do. The others (cancellation, outages, internal
// errors) carry no reason.
var refusalCode = map[codes.Code]bool{
	codes.InvalidArgument: true, codes.NotFound: true, codes.AlreadyExists: true, codes.PermissionDenied: true,
	codes.ResourceExhausted: true, codes.FailedPrecondition: true, codes.Aborted: true, codes.OutOfRange: true,
	codes.Unauthenticated: true,
}

// refusalWords are the machine reasons of refusals whose message is a
// sentence: the words tools match on in the ErrorInfo of the status.
var refusalWords = map[string]string{
	enroll.ReasonPSKMissing:    "psk_missing",
	enroll.ReasonPSKMismatch:   "psk_mismatch",
	enroll.ReasonTicketMissing: "ticket_missing",
	enroll.ReasonTicketUsed:    "ticket_used",
	// A fresh ticket may pass: the agent asks for one (agent/psk.go).
	enroll.ReasonTicketKeyUnknown:    "ticket_key_unknown",
	enroll.ReasonTicketKeyNotFetched: "ticket_key_not_fetched",

	enroll.ReasonTokenExpired:        "token_expired",
	enroll.ReasonTokenUsedUp:         "token_used_up",
	enroll.ReasonTokenSpent:          "token_spent",
	enroll.ReasonTokenBoundElsewhere: "token_bound_elsewhere",
	enroll.ReasonNodeTakenToken:      "node_taken",
	enroll.ReasonNodeTaken:           "node_taken",

	enroll.ReasonChallengeRequired: "challenge_required",

	enroll.ReasonCertificateUnknown: "certificate_unknown",
	enroll.ReasonRenewalsTooOften:   "renewals_too_often",
}

// refusalReason is the ErrorInfo reason of a refusal: DESIGN.md's word
// when the reason is one (locked, deleted, superseded, copy_detected, and
// those of later join methods), the word of a known sentence, or else the
// code as a word (permission_denied), so every refusal carries one.
func refusalReason(code codes.Code, reason string) string {
	if isReasonWord(reason) {
		return reason
	}
	if w, ok := refusalWords[reason]; ok {
		return w
	}
	if strings.HasPrefix(reason, unheldIssuerRefusal) {
		return errinfo.ReasonIssuerUnknown
	}
	return errinfo.CodeWord(code)
}

// isReasonWord reports whether s is a lower-case snake_case word.
func isReasonWord(s string) bool {
	if s == "" || len(s) > 63 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

// refused is a refusal status with message msg and its ErrorInfo reason,
// for the refusals the service layer makes itself (authorization, bad
// requests).
func refused(code codes.Code, msg string) error {
	return errinfo.Error(code, msg, refusalReason(code, msg))
}

// toStatus is the one place where errors become gRPC status codes. Domain
// and store errors carry meaning through sentinels; anything unrecognised is
// an internal error whose detail goes to the log, never to the caller.
func toStatus(ctx context.Context, log *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		// A handler's own refusal status gets its reason here too.
		if len(st.Details()) == 0 && refusalCode[st.Code()] {
			return refused(st.Code(), st.Message())
		}
		return err
	}
	var ia invalidArgument
	var ref *enroll.Refusal
	switch {
	case errors.As(err, new(auditFailed)):
		// Logged where it failed, once.
		if errors.Is(err, store.ErrUnavailable) {
			return storeUnavailable()
		}
		return status.Errorf(codes.Internal, "internal error (correlation id %s)", callerFrom(ctx).CorrelationID)
	case errors.As(err, &ref):
		code := refusalCodes[ref.Kind]
		if !ref.Until.IsZero() {
			// A lock with a TTL: the agent waits until it ends and asks
			// again, instead of stopping for good (the ask is checked
			// again, as any).
			return errinfo.ErrorUntil(code, ref.Reason, refusalReason(code, ref.Reason), ref.Until, time.Now())
		}
		return errinfo.Error(code, ref.Reason, refusalReason(code, ref.Reason))
	case errors.As(err, &ia):
		return refused(codes.InvalidArgument, ia.msg)
	case errors.Is(err, ca.ErrBadCSR), errors.Is(err, ca.ErrKeyType), errors.Is(err, spiffeid.ErrInvalid):
		return refused(codes.InvalidArgument, err.Error())
	case errors.As(err, new(*signer.TimesError)):
		return refused(codes.InvalidArgument, err.Error())
	case errors.Is(err, signer.ErrNotFound):
		return refused(codes.NotFound, err.Error())
	case errors.As(err, new(errRootMovedOn)), errors.As(err, new(rootAborted)):
		return refused(codes.Aborted, err.Error())
	case signer.IsRule(err), errors.As(err, new(rootRule)):
		return refused(codes.FailedPrecondition, err.Error())
	case errors.Is(err, store.ErrNotFound):
		return refused(codes.NotFound, "not found")
	case errors.Is(err, store.ErrConflict):
		return refused(codes.AlreadyExists, "already exists")
	case errors.Is(err, store.ErrUnavailable):
		// A full disk passes, and so does a database outage; the agent
		// retries UNAVAILABLE, not INTERNAL. Logged once per outage
		// (storeOutage), not per request.
		return storeUnavailable()
	}
	if errors.Is(err, custody.ErrUnavailable) || errors.Is(err, custody.ErrKeyMissing) {
		log.Error("request failed: key custody unavailable", "err", err, "correlation_id", callerFrom(ctx).CorrelationID)
		return custodyUnavailable(err)
	}
	if reason, gone := enroll.CallerGone(ctx, err); gone {
		code := codes.Canceled
		if reason == enroll.ReasonDeadlineExceeded {
			code = codes.DeadlineExceeded
		}
		return status.Error(code, reason)
	}
	c := callerFrom(ctx)
	log.Error("request failed", "err", err, "correlation_id", c.CorrelationID)
	return status.Errorf(codes.Internal, "internal error (correlation id %s)", c.CorrelationID)
}
