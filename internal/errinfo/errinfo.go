// Package errinfo puts a machine-readable reason on muster's gRPC refusals
// and reads it back: a google.rpc.ErrorInfo in the status details (AIP-193)
// with domain muster.dev and, as reason, the word DESIGN.md gives for the
// refusal (locked, copy_detected, superseded, deleted, …), so tools branch
// on the reason instead of parsing the message.
package errinfo

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of every muster refusal.
const Domain = "muster.dev"

// ReasonStoreUnavailable is the reason of an UNAVAILABLE answer the
// authority gave because it could not reach its store (its database down
// or restarting, its disk full): unlike an UNAVAILABLE from the transport,
// the authority itself answered. The same call may succeed later.
const ReasonStoreUnavailable = "store_unavailable"

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
