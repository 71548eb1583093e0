package authority

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// streamEndRetry is how often the ends of streams that could not be
// recorded (the store down as they ended) are tried again.
var streamEndRetry = time.Second

// unrecordedEnd is an agent stream's end not yet recorded: the stream of node
// opened at connectedAt, ended at endedAt (this replica's clock: the
// store's was not to be had).
type unrecordedEnd struct {
	node        string
	connectedAt time.Time
}

// pendingEnds are the ends of streams that ended while the store could not
// record them, so that agents list does not show a dead agent connected
// once the store is back. Each is tried again every streamEndRetry until it
// is recorded; CloseAgentStream's condition on the opening time leaves a
// newer stream of the node alone, so a late record is harmless. Lost if
// the replica stops first. Safe for concurrent use.
type pendingEnds struct {
	store store.AgentStreamStore
	log   *slog.Logger
	// unavailable, if set, is told of a failed retry and reports whether
	// it was the store's unavailability (storeOutage.fail, which logs the
	// outage once); other failures are retried unlogged.
	unavailable func(error) bool
	mu          sync.Mutex
	ended       map[unrecordedEnd]time.Time
}

func newPendingEnds(st store.AgentStreamStore, log *slog.Logger) *pendingEnds {
	return &pendingEnds{store: st, log: log, ended: map[unrecordedEnd]time.Time{}}
}

// add keeps the end of node's stream opened at connectedAt, ended at
// endedAt, to be recorded later.
func (p *pendingEnds) add(node string, connectedAt, endedAt time.Time) {
	if p == nil {
		return // a test's bare Server
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended[unrecordedEnd{node, connectedAt}] = endedAt
}

// len is the number of ends not yet recorded.
func (p *pendingEnds) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ended)
}

// run records the pending ends every streamEndRetry until ctx ends.
func (p *pendingEnds) run(ctx context.Context) {
	t := time.NewTicker(streamEndRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := p.flush(ctx); err != nil && ctx.Err() == nil && p.unavailable != nil {
			p.unavailable(err)
		}
	}
}

// flush tries to record every pending end once; it stops at the first
// failure, as the store is then most likely still down, and returns it.
// Each write has the store's deadline (storeJobTimeout), so a hung
// database fails it as unavailable.
func (p *pendingEnds) flush(ctx context.Context) error {
	p.mu.Lock()
	ends := make(map[unrecordedEnd]time.Time, len(p.ended))
	for e, at := range p.ended {
		ends[e] = at
	}
	p.mu.Unlock()
	recorded := 0
	var err error
	for e, at := range ends {
		rctx, cancel := context.WithTimeout(ctx, storeJobTimeout)
		err = p.store.CloseAgentStream(rctx, e.node, e.connectedAt, at)
		cancel()
		if err != nil {
			break
		}
		p.mu.Lock()
		delete(p.ended, e)
		p.mu.Unlock()
		recorded++
	}
	if recorded > 0 {
		p.log.Info("recorded the ends of agent streams that ended while the store was unavailable", "count", recorded)
	}
	return err
}
