package task

import (
	"errors"
	"time"

	"github.com/muster-dev/muster/internal/signer"
)

// MaxWindow bounds the replay window. With tasks living at most
// MaxLifetime, an agent would have to receive more than this many tasks a
// day to fill it; it then refuses new tasks rather than forget an ID that
// could be replayed.
const MaxWindow = 10000

// Window errors.
var (
	ErrReplayed   = errors.New("task: already seen")
	ErrWindowFull = errors.New("task: replay window full")
)

// Window is the persisted set of task IDs an agent has run, each kept until
// its task expires (plus clock allowance): an expired task is refused
// anyway, so forgetting it then is safe. Not safe for concurrent use.
type Window struct{ seen map[string]time.Time }

// NewWindow rebuilds a window from persisted entries (task ID → expiry).
func NewWindow(entries map[string]time.Time) *Window {
	w := &Window{seen: make(map[string]time.Time, len(entries))}
	for id, exp := range entries {
		w.seen[id] = exp
	}
	return w
}

// Entries returns the window for persistence.
func (w *Window) Entries() map[string]time.Time {
	out := make(map[string]time.Time, len(w.seen))
	for id, exp := range w.seen {
		out[id] = exp
	}
	return out
}

// Remember records id until expires. ErrReplayed if it is held already,
// ErrWindowFull if nothing can be forgotten to make room.
func (w *Window) Remember(id string, expires, now time.Time) error {
	if _, ok := w.seen[id]; ok {
		return ErrReplayed
	}
	if len(w.seen) >= MaxWindow {
		w.Prune(now)
		if len(w.seen) >= MaxWindow {
			return ErrWindowFull
		}
	}
	w.seen[id] = expires
	return nil
}

// Prune forgets expired IDs, so the persisted window stays small.
func (w *Window) Prune(now time.Time) {
	for k, exp := range w.seen {
		if now.After(exp.Add(signer.Skew)) {
			delete(w.seen, k)
		}
	}
}
