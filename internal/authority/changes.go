package authority

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// changeWatcher is what a store offers so that open agent streams learn of
// a change committed through any replica without each asking the store:
// PostgreSQL by LISTEN/NOTIFY on a dedicated connection, SQLite by a
// broadcast from its write path. WatchChanges calls notify(nil) once it
// listens (a change before may have gone unseen), then notify with the
// node IDs each committed change concerns (nil: every node), until ctx
// ends (nil) or it can no longer listen (an error; the caller calls
// again). notify must not block.
type changeWatcher interface {
	WatchChanges(ctx context.Context, notify func(nodes []string)) error
}

// streamHub routes change notifications to the open streams they concern,
// by node ID. A stream's channel holds one pending wake-up: changes that
// arrive while it re-checks fold into the next check.
type streamHub struct {
	mu     sync.Mutex
	byNode map[string]map[chan struct{}]struct{}
}

func newStreamHub() *streamHub {
	return &streamHub{byNode: map[string]map[chan struct{}]struct{}{}}
}

// subscribe returns the channel that wakes the stream of node, and the
// function that removes it.
func (h *streamHub) subscribe(node string) (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byNode[node] == nil {
		h.byNode[node] = map[chan struct{}]struct{}{}
	}
	h.byNode[node][c] = struct{}{}
	return c, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.byNode[node], c)
		if len(h.byNode[node]) == 0 {
			delete(h.byNode, node)
		}
	}
}

// notify wakes the streams of nodes, or every stream for nil.
func (h *streamHub) notify(nodes []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if nodes == nil {
		for _, cs := range h.byNode {
			wake(cs)
		}
		return
	}
	for _, n := range nodes {
		wake(h.byNode[n])
	}
}

func wake(cs map[chan struct{}]struct{}) {
	for c := range cs {
		select {
		case c <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// Backoff between attempts to listen again after the store's notification
// connection was lost.
const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 5 * time.Second
)

// watchChanges feeds the hub from the store until ctx ends. When the
// notification connection is lost it listens again, with backoff, and the
// store's first notify(nil) makes every stream re-check what it may have
// missed. A store that cannot announce changes gets the streams woken
// every streamCheckEvery instead.
func (s *Server) watchChanges(ctx context.Context) {
	w, ok := s.store.(changeWatcher)
	if !ok {
		t := time.NewTicker(streamCheckEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.hub.notify(nil)
			}
		}
	}
	wait := watchRetryMin
	for {
		start := time.Now()
		err := w.WatchChanges(ctx, s.hub.notify)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > watchRetryMax {
			wait = watchRetryMin // it listened for a while: a fresh failure
		}
		s.log.Warn("lost the store's change notifications; listening again (open agent streams re-check once it listens)", "err", err)
		s.streams.watchLost.Inc()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, watchRetryMax)
	}
}
