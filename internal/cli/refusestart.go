package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// startRecorder writes the audit record of a refused start (audit.Logger).
type startRecorder interface {
	Record(ctx context.Context, e audit.Event) (store.AuditRecord, error)
}

// refuseStart records the start refused for err (what: the step that
// refused it) and returns err, the refusal the operator acts on. A record
// that cannot be written does not replace it, as the start changed
// nothing and the refusal names the way out; it is logged with the
// refusal's reason and told in the error, so the refusal is never kept
// out of the chain unsaid.
func refuseStart(ctx context.Context, rec startRecorder, log *slog.Logger, authorityID, what string, err error) error {
	reason := what + ": " + err.Error()
	_, aerr := rec.Record(context.WithoutCancel(ctx), audit.Event{Actor: "authority", Action: "authority.start", Target: authorityID,
		Result: audit.ResultDenied, Reason: reason})
	if aerr == nil {
		return err
	}
	log.Error("refused start not audited: its record could not be written", "reason", reason, "err", aerr)
	return fmt.Errorf("%w (this refusal is not in the audit chain either: %v)", err, aerr)
}

// recordFailure records e, the audit record of a command that failed with
// err, and returns err. A record that cannot be written does not replace
// err (the failure is what the operator acts on) but is told in it, so a
// failure is never kept out of the chain unsaid.
func recordFailure(ctx context.Context, rec startRecorder, e audit.Event, err error) error {
	if _, aerr := rec.Record(context.WithoutCancel(ctx), e); aerr != nil {
		return fmt.Errorf("%w (this failure is not in the audit chain: its record could not be written: %v)", err, aerr)
	}
	return err
}
