package authority

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/store"
)

// storeUnavailable is the answer to a call that failed on
// store.ErrUnavailable. Agents retry UNAVAILABLE with backoff; the admin
// CLI tells it from an authority it cannot reach by its reason.
func storeUnavailable() error {
	return errinfo.Error(codes.Unavailable, "the authority's store is unavailable; retry later", errinfo.ReasonStoreUnavailable)
}

// custodyUnavailable is the answer to a call that failed because the
// key it needed could not be used (custody.ErrUnavailable, ErrKeyMissing).
// Agents retry UNAVAILABLE with backoff, so they ride out a token re-opened
// or restored, or a successor activated, instead of stopping (INTERNAL is
// permanent for them). The answer says which of the two it is and what
// brings the key back (an operator's command is refused with it, and it
// is the refusal's audited reason); the detail (the object, the error)
// is logged.
func custodyUnavailable(err error) error {
	msg := "the authority's PKCS#11 token is unavailable now (its /readyz and log say why); the authority re-opens it by itself once it answers: " +
		"bring the token back (the module, PIN and token the authority started with), then retry"
	if errors.Is(err, custody.ErrKeyMissing) {
		msg = "a key this call needs is not in the authority's PKCS#11 token (its /readyz and log name the object and the way out: " +
			"restore the token from its backup, or replace the key; docs/hsm.md \"A lost token\"); retry once that is done"
	}
	return errinfo.Error(codes.Unavailable, msg, errinfo.ReasonKeyCustodyUnavailable)
}

// storeJobTimeout bounds the store calls of a job that has no caller
// waiting with a deadline of its own (recording a stream's end or a task
// result, the pending stream ends, the probe of an outage, what the
// replica records as it stops). It outlasts the store's own deadline for
// a request (PostgreSQL: limits.store_timeout, at most 20 s, plus the 5 s
// pgx takes to give a cancelled statement up; SQLite: its 10 s
// busy_timeout), so a database that hangs fails the job with
// store.ErrUnavailable, logged once as the outage and naming the setting
// that governs it, not with this deadline: at 5 s, shorter than the
// default store timeout's 10 s, it was "context deadline exceeded",
// logged by each job as a failure of its own.
const storeJobTimeout = 30 * time.Second

// storeProbeEvery is how often, while the store is unavailable, the
// authority asks it the time to learn that it is back.
var storeProbeEvery = 500 * time.Millisecond

// storeOutage turns the failures of a store outage into two log lines: one
// when the first request fails because the store is unavailable, one when
// the store answers again, with the count of what failed meanwhile —
// rather than one line per failed request, heartbeat or audit write. Safe
// for concurrent use.
type storeOutage struct {
	log   *slog.Logger
	probe func(context.Context) error

	mu     sync.Mutex
	down   bool
	since  time.Time
	failed int64
	// started wakes run at the start of an outage.
	started chan struct{}
}

func newStoreOutage(log *slog.Logger, probe func(context.Context) error) *storeOutage {
	return &storeOutage{log: log, probe: probe, started: make(chan struct{}, 1)}
}

// fail reports whether err is the store's unavailability, and then starts
// an outage if none is under way (logged once); the caller logs any other
// error itself. A nil *storeOutage (a test's bare Server) reports false.
func (o *storeOutage) fail(err error) bool {
	if o == nil || !errors.Is(err, store.ErrUnavailable) {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.begin(err)
	return true
}

// isDown reports whether an outage is under way: the store has not
// answered since a request failed on its unavailability. A nil
// *storeOutage reports false.
func (o *storeOutage) isDown() bool {
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.down
}

// begin starts an outage unless one is under way. o.mu is held.
func (o *storeOutage) begin(err error) {
	if o.down {
		return
	}
	o.down, o.since = true, time.Now()
	args := []any{}
	if err != nil {
		args = append(args, "err", err)
	}
	o.log.Error("the store is unavailable: requests are answered UNAVAILABLE until it is back (logged once)", args...)
	select {
	case o.started <- struct{}{}:
	default:
	}
}

// run probes the store during each outage until it answers, then logs
// that it is back, until ctx ends.
func (o *storeOutage) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.started:
		}
		t := time.NewTicker(storeProbeEvery)
		for back := false; !back; {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(ctx, storeJobTimeout)
			back = o.probe(pctx) == nil
			cancel()
		}
		t.Stop()
		o.mu.Lock()
		o.log.Info("the store is available again", "unavailable_for", time.Since(o.since).Round(time.Millisecond).String(),
			"failed_requests", o.failed)
		o.down, o.failed = false, 0
		o.mu.Unlock()
	}
}

// observe counts a call answered storeUnavailable, the requests an
// outage's last line counts.
func (o *storeOutage) observe(err error) {
	if o == nil || err == nil || errinfo.Reason(err) != errinfo.ReasonStoreUnavailable {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failed++
	o.begin(nil)
}
