package audit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Limits of a Refusals window.
const (
	// RefusalsPerSource is how many refusals of one source are recorded
	// one by one in a window.
	RefusalsPerSource = 20
	// RefusalsPerWindow is how many refusals, of every source together,
	// are recorded one by one in a window: sources are cheap to vary (an
	// IPv6 prefix holds billions), so the per-source cap alone would not
	// bound the chain.
	RefusalsPerWindow = 500
	// RefusalSources is how many sources a window counts separately; the
	// refusals of further sources are aggregated together.
	RefusalSources = 100
	// RefusalWindow is the length of a window.
	RefusalWindow = time.Minute
)

// OtherSources is the Target and Source of the aggregate record of the
// sources past RefusalSources.
const OtherSources = "other sources"

// Refusals writes refusals to the audit log, but only the first
// RefusalsPerSource of each source, and RefusalsPerWindow in all, per
// window: past that it counts them, and when the window closes writes one
// aggregate record (action api.access.flood) per source that went over.
// Whoever floods a server with bad requests cannot flood the audit chain,
// and the operator still sees that the flood happened and where it came
// from. Safe for concurrent use; Run closes the windows.
type Refusals struct {
	log   *Logger
	slog  *slog.Logger
	actor string
	now   func() time.Time
	// Reported, if set, reports whether a failed write's error was already
	// reported elsewhere (the store unavailable, which the server logs once
	// for the whole outage): such a failure is not logged once more. Set
	// before the first Record.
	Reported func(error) bool

	mu      sync.Mutex
	start   time.Time
	total   int
	bySrc   map[string]int
	dropped map[string]int
}

// NewRefusals returns the flood guard of l. actor names the server in the
// aggregate records ("authority", "discovery"); failed audit writes are
// logged to sl.
func NewRefusals(l *Logger, actor string, sl *slog.Logger) *Refusals {
	if sl == nil {
		sl = slog.Default()
	}
	r := &Refusals{log: l, slog: sl, actor: actor, now: time.Now}
	r.start, r.bySrc, r.dropped = r.now(), map[string]int{}, map[string]int{}
	return r
}

// Record writes e, a refusal, unless its source or the window is over its
// cap. The write does not inherit ctx's cancellation: a refusal is recorded
// even when the caller gave up on the request.
func (r *Refusals) Record(ctx context.Context, e Event) {
	r.mu.Lock()
	r.bySrc[e.Source]++
	r.total++
	over := r.bySrc[e.Source] > RefusalsPerSource || r.total > RefusalsPerWindow
	if over {
		src := e.Source
		if _, ok := r.dropped[src]; !ok && len(r.dropped) >= RefusalSources {
			src = OtherSources
		}
		r.dropped[src]++
	}
	r.mu.Unlock()
	if over {
		return
	}
	if _, err := r.log.Record(context.WithoutCancel(ctx), e); err != nil {
		r.failed(e, err)
	}
}

// failed logs a write of e that failed with err, unless it was reported.
func (r *Refusals) failed(e Event, err error) {
	if r.Reported != nil && r.Reported(err) {
		return
	}
	r.slog.Error("audit write failed", "action", e.Action, "err", err)
}

// Flush closes the window: one aggregate record per source that went over.
func (r *Refusals) Flush(ctx context.Context) {
	r.mu.Lock()
	dropped, start := r.dropped, r.start
	r.start, r.total, r.bySrc, r.dropped = r.now(), 0, map[string]int{}, map[string]int{}
	r.mu.Unlock()
	for src, n := range dropped {
		e := Event{
			Actor:  r.actor,
			Action: "api.access.flood",
			Target: src,
			Result: ResultDenied,
			Reason: fmt.Sprintf("%d further refusals from this source since %s not recorded one by one", n, start.UTC().Format(time.RFC3339)),
			Source: src,
		}
		if src == OtherSources {
			e.Reason = fmt.Sprintf("%d further refusals from sources past the first %d since %s not recorded one by one",
				n, RefusalSources, start.UTC().Format(time.RFC3339))
		}
		if _, err := r.log.Record(ctx, e); err != nil {
			r.failed(e, err)
		}
	}
}

// Run closes a window every RefusalWindow until ctx ends, then closes the
// last one and returns nil.
func (r *Refusals) Run(ctx context.Context) error {
	t := time.NewTicker(RefusalWindow)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalCheckpointTimeout)
			r.Flush(fctx)
			cancel()
			return nil
		case <-t.C:
			r.Flush(ctx)
		}
	}
}
