// Package errinfo puts a machine-readable reason on muster's gRPC refusals
// and reads it back: a google.rpc.ErrorInfo in the status details (AIP-193)
// with domain muster.dev and, as reason, the word DESIGN.md gives for the
// refusal (locked, copy_detected, superseded, deleted, …), so tools branch
// on the reason instead of parsing the message.
package errinfo

import (
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every muster refusal.
const Domain = "muster.dev"

// ReasonStoreUnavailable is the reason of an UNAVAILABLE answer the
// authority gave because it could not reach its store (its database down
// or restarting, its disk full): unlike an UNAVAILABLE from the transport,
// the authority itself answered. The same call may succeed later.
const ReasonStoreUnavailable = "store_unavailable"

// ReasonIssuerUnknown is the reason of an UNAUTHENTICATED refusal of a
// certificate whose issuer is named as one of the authority's
// intermediates but is none it holds: its store restored from a backup
// taken before that intermediate was prepared, or the intermediate
// retired. No retry helps: the refusal names the join that brings the
// node back, and an agent renews at once to be told so.
const ReasonIssuerUnknown = "issuer_unknown"

// ReasonKeyCustodyUnavailable is the reason of an UNAVAILABLE answer the
// authority gave because the key it signs with could not be used: its
// PKCS#11 token unreachable (being re-opened), or the key's object gone
// from it until the token is restored or a successor activated. The
// authority itself answered; the same call may succeed later.
const ReasonKeyCustodyUnavailable = "key_custody_unavailable"

// Error returns a status error with code and msg that carries reason in
// an ErrorInfo. An empty reason gives a status without details.
func Error(code codes.Code, msg, reason string) error {
	st := status.New(code, msg)
	if reason == "" {
		return st.Err()
	}
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: Domain})
	if err != nil {
		// Only a detail that cannot be marshalled fails; ErrorInfo can.
		return st.Err()
	}
	return withInfo.Err()
}

// UntilKey is the ErrorInfo metadata key of the time (RFC 3339, UTC) a
// refusal ends by itself: a lock's expiry. For people and tools reading the
// refusal; an agent waits by the RetryInfo beside it, which is relative
// and so does not depend on its clock agreeing with the authority's.
const UntilKey = "until"

// ErrorUntil is Error for a refusal that ends by itself at until (a lock
// with a TTL), told at now: besides the ErrorInfo (with until in its
// metadata) it carries a google.rpc.RetryInfo whose delay is what is left,
// never negative.
func ErrorUntil(code codes.Code, msg, reason string, until, now time.Time) error {
	st := status.New(code, msg)
	left := max(until.Sub(now), 0)
	withInfo, err := st.WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: map[string]string{UntilKey: until.UTC().Format(time.RFC3339)}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(left)})
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// RetryDelay is the delay of the RetryInfo err carries: how long until the
// refusal ends by itself. ok is false when it carries none (a refusal that
// lasts until someone lifts it, or a server older than the details).
func RetryDelay(err error) (d time.Duration, ok bool) {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return 0, false
	}
	for _, det := range se.GRPCStatus().Details() {
		if ri, isRetry := det.(*errdetails.RetryInfo); isRetry && ri.GetRetryDelay().IsValid() {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}

// Reason is the muster.dev reason err carries, or "" when it carries none
// (not a status, another domain, or a server older than the details).
func Reason(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return ""
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}

// CodeWord is a gRPC code as a lower-case word (permission_denied,
// not_found): the reason of a refusal DESIGN.md names no word for, and the
// value of the result labels of the authority's and the agent's metrics.
func CodeWord(c codes.Code) string {
	if w, ok := codeWords[c]; ok {
		return w
	}
	return "unknown"
}

var codeWords = map[codes.Code]string{
	codes.OK: "ok", codes.Canceled: "cancelled", codes.Unknown: "unknown", codes.InvalidArgument: "invalid_argument",
	codes.DeadlineExceeded: "deadline_exceeded", codes.NotFound: "not_found", codes.AlreadyExists: "already_exists",
	codes.PermissionDenied: "permission_denied", codes.ResourceExhausted: "resource_exhausted",
	codes.FailedPrecondition: "failed_precondition", codes.Aborted: "aborted", codes.OutOfRange: "out_of_range",
	codes.Unimplemented: "unimplemented", codes.Internal: "internal", codes.Unavailable: "unavailable",
	codes.DataLoss: "data_loss", codes.Unauthenticated: "unauthenticated",
}
