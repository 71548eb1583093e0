package enroll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
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
	KindDeadlineExceeded                   // the caller did not answer in time
)

// Refusal is a request the authority turned down for a reason the caller
// may know. Reason goes to the caller; Detail, which may say more (a token
// ID, a serial), only to the audit log.
type Refusal struct {
	Kind   Kind
	Reason string
	Detail string
	// Until is when the refusal ends by itself (a lock's expiry), told
	// to the caller so an agent retries then; zero when only an
	// operator ends it. A retry before or after is checked again.
	Until time.Time
}

func (r *Refusal) Error() string { return r.Reason }

func refuse(k Kind, reason string) *Refusal { return &Refusal{Kind: k, Reason: reason} }

func (r *Refusal) with(format string, args ...any) *Refusal {
	r.Detail = fmt.Sprintf(format, args...)
	return r
}

// lockedBy is the refusal of a request for the lock l in force ("locked"),
// ending when l expires (never, without a TTL); the detail, for the audit
// log, names l. lockedOn tells a later end when another lock applies.
func lockedBy(l store.Lock, format string, args ...any) *Refusal {
	r := refuse(KindPermissionDenied, ReasonLocked).with(format, args...)
	// The way out, for the operator reading the record.
	r.Detail += fmt.Sprintf("; muster lock delete %s lifts it (muster lock list says why it was made)", l.ID)
	r.Until = l.ExpiresAt
	return r
}

// lockedOn is lockedBy for the lock l, found on one of targets (the one
// the store names first): the refusal ends when the last lock in force
// on any of targets does (never, if one has no TTL), since an agent told
// l's end would retry then and be refused again for another. One more
// query, only when a request is refused for a lock. When it fails, or
// finds the locks gone since, the refusal keeps l's end: the reason is
// still true, and a retry is checked again.
func (s *Service) lockedOn(ctx context.Context, targets []store.LockTarget, l store.Lock, format string, args ...any) *Refusal {
	r := lockedBy(l, format, args...)
	if end, err := s.cfg.Store.LockEnd(ctx, store.Named(targets)); err == nil {
		r.Until = end
	}
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

// ReasonCertificateUnknown refuses a renewal whose certificate the store
// has no record of: usually a store restored from a backup taken before
// the agent's last renewal. The agent's way out is to join again.
const ReasonCertificateUnknown = "certificate unknown to this authority"

// certificateUnknown refuses serial, presented by node, as unknown; the
// detail (the audit log's) names the way out, the agent's (RejoinCommand
// in package agent) with the agent's own data directory.
func certificateUnknown(serial, node string) *Refusal {
	if node == "" {
		// A leaf without a node name to give: the operator fills it in.
		node = "NODE"
	}
	return refuse(KindPermissionDenied, ReasonCertificateUnknown).with(
		"serial %s; join again over this identity: muster agent join --force --data ADIR --node %s with a joining URI from muster token create --node %s (docs/high-availability.md, \"Backup and restore\")",
		serial, node, node)
}

// AuditText is r as an audit record gives it: the reason and the detail
// only the audit log sees.
func (r *Refusal) AuditText() string {
	if r.Detail == "" {
		return r.Reason
	}
	return r.Reason + ": " + r.Detail
}

// Reasons of calls that ended because the caller went away, as the
// service layer answers and the audit log records them.
const (
	ReasonCanceled         = "canceled: the caller went away before the answer"
	ReasonDeadlineExceeded = "deadline_exceeded: the call's deadline passed before the answer"
)

// CallerGone says whether err ended a call because the caller went away —
// the call's context ended, or err is a context's own error (a stream's
// exchange ends with it) — and the reason to answer and audit. What the
// store answers an interrupted query with (SQLite's "interrupted", a
// connection closed mid-query) does not always wrap ctx.Err(), so the
// context is asked too.
func CallerGone(ctx context.Context, err error) (string, bool) {
	switch {
	case err == nil:
		return "", false
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonDeadlineExceeded, true
	case errors.Is(err, context.Canceled):
		return ReasonCanceled, true
	case ctx.Err() == nil:
		return "", false
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return ReasonDeadlineExceeded, true
	}
	return ReasonCanceled, true
}

// lockedAtWrite turns the store's refusal of a join's or renewal's write
// by a lock created since its read (*store.LockedError) into the refusal
// of a lock seen at the read: the same code and reason word ("locked"),
// the lock named in the audit record. Other errors pass unchanged.
func lockedAtWrite(err error) error {
	var le *store.LockedError
	if !errors.As(err, &le) {
		return err
	}
	l := le.Lock
	return lockedBy(l, "lock %s on %s %s, at the write", l.ID, l.Kind, l.Target)
}

// finish audits the outcome of a join or renewal: a refusal (through the
// flood guard, with the detail only the audit log sees), an internal
// error, or a success whose record was not already written with the change.
// A failure because the store is unavailable is not written: the record
// would go to the store that just failed, and where the store hangs
// rather than refusing, the attempt cost the caller a second store
// deadline (up to 25 s more), past the 30 s agents give a renewal. The
// authority logs the outage once, with the count of what failed meanwhile
// (docs/high-availability.md).
func (s *Service) finish(ctx context.Context, ev audit.Event, iss *Issued, err error) (*Issued, error) {
	err = lockedAtWrite(err)
	var ref *Refusal
	goneReason, gone := CallerGone(ctx, err)
	switch {
	case errors.As(err, &ref):
		ev.Result, ev.Reason = audit.ResultDenied, ref.AuditText()
		s.cfg.Audit.Refuse(ctx, ev)
	case errors.Is(err, store.ErrUnavailable):
	case gone:
		// Not the authority's failure, nor a refusal: the caller stopped
		// waiting, and the record says so (gRPC's word, as it is answered).
		ev.Result, ev.Reason = audit.ResultError, goneReason
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
