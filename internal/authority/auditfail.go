package authority

import (
	"context"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// auditFailed is an audit write that failed and has been logged where it
// failed (recordAudit). Returned up a request, toStatus answers it as an
// internal error (unavailable when the store is) without logging it a
// second time: before, the operator read one failure as two, the second
// without the record's target.
type auditFailed struct{ err error }

func (e auditFailed) Error() string { return e.err.Error() }
func (e auditFailed) Unwrap() error { return e.err }

// recordAudit writes e, even when the caller has gone. A failure is logged
// here, once, with what the operator needs to find the gap in the chain:
// the record's action and target, and the request's correlation ID.
func (s *Server) recordAudit(ctx context.Context, e audit.Event) error {
	_, err := loggedAudit{s}.Record(ctx, e)
	return err
}

// loggedAudit is recordAudit as an auditor, for the packages that record
// on their own (the signer keeper). Their changes are written with their
// records (Builder, Appended); what Record writes is a refusal, which
// stands whether or not its record is written — the log line here is then
// the operator's only sign of it.
type loggedAudit struct{ s *Server }

func (a loggedAudit) Builder(e audit.Event) (*audit.Link, error) { return a.s.audit.Builder(e) }

func (a loggedAudit) Appended(link *audit.Link) { a.s.audit.Appended(link) }

func (a loggedAudit) Record(ctx context.Context, e audit.Event) (store.AuditRecord, error) {
	s := a.s
	rec, err := s.audit.Record(context.WithoutCancel(ctx), e)
	if err != nil && s.outage.fail(err) {
		// Nothing was written, and the request fails with the store
		// unavailable; the outage is logged once.
		return rec, auditFailed{err}
	}
	if err != nil {
		id := e.CorrelationID
		if id == "" {
			id = callerFrom(ctx).CorrelationID
		}
		// The result and reason too: for a refusal, whose record is
		// all that remains of it, this line is then the record.
		s.log.Error("audit record not written", "action", e.Action, "target", e.Target, "result", e.Result, "reason", e.Reason,
			"correlation_id", id, "err", err)
		return rec, auditFailed{err}
	}
	return rec, nil
}
