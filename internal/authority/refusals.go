package authority

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/audit"
)

// refusalAuditor writes refusals to the audit log, but at most perWindow of
// them per source and window: past that it counts, and writes one aggregate
// record per source when the window closes. Whoever floods the authority
// with bad requests cannot flood the audit chain, and the operator still
// sees that the flood happened and where it came from.
type refusalAuditor struct {
	log       *audit.Logger
	slog      *slog.Logger
	perWindow int
	window    time.Duration

	mu      sync.Mutex
	start   time.Time
	bySrc   map[string]int
	dropped map[string]int
}

func newRefusalAuditor(l *audit.Logger, sl *slog.Logger) *refusalAuditor {
	return &refusalAuditor{log: l, slog: sl, perWindow: 20, window: time.Minute,
		start: time.Now(), bySrc: map[string]int{}, dropped: map[string]int{}}
}

func (r *refusalAuditor) record(ctx context.Context, e audit.Event) {
	r.mu.Lock()
	r.bySrc[e.Source]++
	over := r.bySrc[e.Source] > r.perWindow
	if over {
		r.dropped[e.Source]++
	}
	r.mu.Unlock()
	if over {
		return
	}
	// The refusal must be recorded even when the caller gave up on the
	// request, so the write does not inherit its cancellation.
	if _, err := r.log.Record(context.WithoutCancel(ctx), e); err != nil {
		r.slog.Error("audit write failed", "action", e.Action, "err", err)
	}
}

// flush closes the window: one aggregate record per source that went over.
func (r *refusalAuditor) flush(ctx context.Context) {
	r.mu.Lock()
	dropped, start := r.dropped, r.start
	r.start, r.bySrc, r.dropped = time.Now(), map[string]int{}, map[string]int{}
	r.mu.Unlock()
	for src, n := range dropped {
		e := audit.Event{
			Actor:  "authority",
			Action: "api.access.flood",
			Target: src,
			Result: audit.ResultDenied,
			Reason: fmt.Sprintf("%d further refusals from this source since %s not recorded one by one", n, start.UTC().Format(time.RFC3339)),
			Source: src,
		}
		if _, err := r.log.Record(ctx, e); err != nil {
			r.slog.Error("audit write failed", "action", e.Action, "err", err)
		}
	}
}

func (r *refusalAuditor) Run(ctx context.Context) error {
	t := time.NewTicker(r.window)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			r.flush(fctx)
			cancel()
			return nil
		case <-t.C:
			r.flush(ctx)
		}
	}
}
