package authority

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// changeWatcher is what a store offers so that open agent streams learn of
// a change committed through any replica without each asking the store:
// PostgreSQL by LISTEN/NOTIFY on a dedicated connection, SQLite by a
// broadcast from its write path. WatchChanges announces store.ChangeAll for
// every node once it listens (a change before may have gone unseen), then
// each committed change, until ctx ends (nil) or it can no longer listen
// (an error; the caller calls again). notify must not block.
type changeWatcher interface {
	WatchChanges(ctx context.Context, notify func(store.Change)) error
}

// streamHub routes change notifications to the open streams they concern,
// by node ID.
type streamHub struct {
	mu     sync.Mutex
	byNode map[string]map[*streamWake]struct{}
}

// streamWake is one stream's subscription: the kinds of change it has yet
// to re-check, and a channel holding one pending wake-up, so changes that
// arrive while the stream re-checks fold into its next check.
type streamWake struct {
	c       chan struct{}
	mu      sync.Mutex
	pending store.ChangeKind
}

// take returns the kinds of change pending and clears them.
func (w *streamWake) take() store.ChangeKind {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.pending
	w.pending = 0
	return k
}

func (w *streamWake) wake(k store.ChangeKind) {
	w.mu.Lock()
	w.pending |= k
	w.mu.Unlock()
	select {
	case w.c <- struct{}{}:
	default: // a wake-up is pending already
	}
}

func newStreamHub() *streamHub {
	return &streamHub{byNode: map[string]map[*streamWake]struct{}{}}
}

// subscribe returns the subscription of a stream of node, and the function
// that removes it.
func (h *streamHub) subscribe(node string) (*streamWake, func()) {
	w := &streamWake{c: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byNode[node] == nil {
		h.byNode[node] = map[*streamWake]struct{}{}
	}
	h.byNode[node][w] = struct{}{}
	return w, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.byNode[node], w)
		if len(h.byNode[node]) == 0 {
			delete(h.byNode, node)
		}
	}
}

// notify wakes the streams a change concerns: those of its nodes, or every
// stream.
func (h *streamHub) notify(c store.Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.Nodes == nil {
		for _, ws := range h.byNode {
			for w := range ws {
				w.wake(c.Kind)
			}
		}
		return
	}
	for _, n := range c.Nodes {
		for w := range h.byNode[n] {
			w.wake(c.Kind)
		}
	}
}

// onChange routes a change: a CA step to the intermediates' refresh too, a
// signer step to the heartbeats' cached set version too, a shared
// setting's write to settingsClock alone, and every other change to the
// open streams it concerns. A CA step alone is not passed to the
// streams: they have nothing to do until the intermediates are read
// again, and setTrustBundle wakes them then, once, if the bundle changed.
// (A wider change, such as everything after listening again, is.)
func (s *Server) onChange(c store.Change) {
	if c.Kind&store.ChangeCA != 0 {
		s.inter.changed()
	}
	if c.Kind&store.ChangeSigners != 0 && s.setAhead != nil {
		s.setAhead.version.invalidate()
	}
	if c.Kind&store.ChangeSettings != 0 {
		s.pokeSettings()
	}
	// A shared setting concerns no stream (a stream ignores its bit in a
	// wider change).
	if c.Kind&^(store.ChangeCA|store.ChangeSettings) != 0 {
		s.hub.notify(c)
	}
	s.pokeCRL(c)
}

// Backoff between attempts to listen again after the store's notification
// connection was lost. The cap is low: while the database is down each
// attempt costs one refused connection, and once it is back, a lock made
// through another replica must still close this replica's streams within
// a second or two.
const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = time.Second
)

// watchChanges feeds the hub from the store until ctx ends. When the
// notification connection is lost it listens again, with backoff, and the
// store's first notify(nil) makes every stream re-check what it may have
// missed. A loss is logged and counted once, however many attempts it
// takes to listen again, and listening again is logged once. A store that
// cannot announce changes gets the streams woken every streamCheckEvery
// instead.
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
				s.onChange(store.Change{Kind: store.ChangeAll})
			}
		}
	}
	// listening is set by the first notification of each WatchChanges,
	// the one it sends once it listens (which may come from the store's
	// own goroutine). lostAt is when the last loss began, zero at start.
	var listening atomic.Bool
	listening.Store(true) // a first attempt that fails is a loss too
	var lostAt time.Time
	notify := func(c store.Change) {
		if !listening.Swap(true) {
			s.log.Info("listening again to the store's change notifications; open agent streams re-check",
				"lost_for", time.Since(lostAt).Round(time.Millisecond).String())
		}
		s.onChange(c)
	}
	wait := watchRetryMin
	for {
		err := w.WatchChanges(ctx, notify)
		if ctx.Err() != nil {
			return
		}
		if listening.Swap(false) {
			lostAt, wait = time.Now(), watchRetryMin
			s.log.Warn("lost the store's change notifications; listening again (open agent streams re-check once it listens)", "err", err)
			s.streams.watchLost.Inc()
		} else {
			s.log.Debug("cannot listen to the store's change notifications yet", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, watchRetryMax)
	}
}
