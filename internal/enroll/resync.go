package enroll

import (
	"context"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/boundkeypair"
)

// epochs reads the authority epochs the resync windows began, for judging
// a join state at now.
func (s *Service) epochs(ctx context.Context, now time.Time) (boundkeypair.Epochs, error) {
	list, err := s.cfg.Store.ListResyncEpochs(ctx)
	if err != nil {
		return boundkeypair.Epochs{}, err
	}
	ep := boundkeypair.Epochs{Ordinal: make(map[string]int64, len(list))}
	for _, e := range list {
		ep.Ordinal[e.ID] = e.Ordinal
		ep.Current, ep.WindowOpen = e.ID, e.OpenAt(now)
	}
	return ep, nil
}

// auditResync records a committed resync (token.resync): what the token was
// brought forward from and to, so an operator can review every token a
// window let through.
func (s *Service) auditResync(ctx context.Context, out *bkOutcome, nodeID string) error {
	v := out.resync
	return s.cfg.Audit.Record(ctx, audit.Event{Actor: "authority", Action: "token.resync", Target: "token " + out.token.ID,
		Result: audit.ResultOK, Reason: fmt.Sprintf("node %s: join state ahead of the restored store accepted in resync epoch %q: sequence %d (epoch %q) brought forward to %d",
			nodeID, v.Epoch, v.ExpectedSequence, v.ExpectedEpoch, v.Sequence)})
}
