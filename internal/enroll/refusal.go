package enroll

import (
	"context"
	"errors"
	"fmt"

	"github.com/muster-dev/muster/internal/audit"
)

// Kind classifies a refusal. The service layer maps each kind to one gRPC
// code; the domain never names codes.
type Kind int

const (
	KindInvalid            Kind = iota + 1 // malformed request
	KindRateLimited                        // source over its limit
	KindNotFound                           // unknown token, or wrong secret: alike on purpose
	KindFailedPrecondition                 // token expired or used up
	KindPermissionDenied                   // bound elsewhere, locked, deleted, superseded, copied
	KindAlreadyExists                      // node ID held by another machine
	KindUnauthenticated                    // no usable identity
	KindUnavailable                        // a dependency is down; retrying may succeed
)

// Refusal is a request the authority turned down for a reason the caller
// may know. Reason goes to the caller; Detail, which may say more (a token
// ID, a serial), only to the audit log.
type Refusal struct {
	Kind   Kind
	Reason string
	Detail string
}

func (r *Refusal) Error() string { return r.Reason }

func refuse(k Kind, reason string) *Refusal { return &Refusal{Kind: k, Reason: reason} }

func (r *Refusal) with(format string, args ...any) *Refusal {
	r.Detail = fmt.Sprintf(format, args...)
	return r
}

// Reasons of renewal refusals, as DESIGN.md names them: agents and
// operators match on these words.
const (
	ReasonLocked       = "locked"
	ReasonDeleted      = "deleted"
	ReasonSuperseded   = "superseded"
	ReasonCopyDetected = "copy_detected"
)

// Reasons of calls that ended because the caller went away, as the
// service layer answers and the audit log records them.
const (
	ReasonCanceled         = "canceled: the caller went away before the answer"
	ReasonDeadlineExceeded = "deadline_exceeded: the call's deadline passed before the answer"
)

// CallerGone is the reason of a call whose context ended: canceled or
// deadline exceeded. Only meaningful when ctx.Err() is not nil.
func CallerGone(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ReasonDeadlineExceeded
	}
	return ReasonCanceled
}

// finish audits the outcome of a join or renewal: a refusal (through the
// flood guard, with the detail only the audit log sees), an internal
// error, or a success whose record was not already written with the change.
func (s *Service) finish(ctx context.Context, ev audit.Event, iss *Issued, err error) (*Issued, error) {
	var ref *Refusal
	switch {
	case errors.As(err, &ref):
		ev.Result, ev.Reason = audit.ResultDenied, ref.Reason
		if ref.Detail != "" {
			ev.Reason += ": " + ref.Detail
		}
		s.cfg.Audit.Refuse(ctx, ev)
	case err != nil && ctx.Err() != nil:
		// Not the authority's failure: the caller stopped waiting. Whatever
		// the store answered the interrupted call with, say that.
		ev.Result, ev.Reason = audit.ResultError, CallerGone(ctx)
		s.cfg.Audit.Refuse(ctx, ev)
	case errors.Is(err, context.Canceled):
		// The caller went away mid-exchange: neither a refusal nor the
		// authority's failure, and said so (gRPC's word, as it is answered).
		ev.Result, ev.Reason = audit.ResultError, ReasonCanceled
		s.cfg.Audit.Refuse(ctx, ev)
	case errors.Is(err, context.DeadlineExceeded):
		ev.Result, ev.Reason = audit.ResultError, ReasonDeadlineExceeded
		s.cfg.Audit.Refuse(ctx, ev)
	case err != nil:
		ev.Result, ev.Reason = audit.ResultError, "internal error"
		s.cfg.Audit.Refuse(ctx, ev)
	case !iss.audited:
		ev.Result = audit.ResultOK
		if err := s.cfg.Audit.Record(ctx, ev); err != nil {
			return nil, err
		}
	}
	return iss, err
}
