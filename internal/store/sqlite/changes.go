package sqlite

import (
	"context"
	"sync"

	"github.com/muster-dev/muster/internal/store"
)

// changeHub broadcasts the changes an open agent stream must learn of (a
// lock, a node's deletion or supersession, a task queued for it, a signer
// step) to the watchers of one database file. The authority holds the data
// directory's lock and the file's, so every write but an offline
// command's comes from this process, and every handle opened on the same
// file shares the hub: a change committed through one handle is announced
// to a watcher on another. Writes announce themselves after their commit
// returns, never before. An offline command's write (ca rotate --offline,
// settings set --offline) is announced in its own process only: the
// authority reads what such commands change on its own clock too
// (authority's caRefresh, SettingsRefresh).
type changeHub struct {
	mu    sync.Mutex
	refs  int
	watch map[*watcher]struct{}
}

type watcher struct{ notify func(store.Change) }

var (
	hubsMu sync.Mutex
	hubs   = map[string]*changeHub{} // by the file's absolute path
)

// acquireHub returns the hub of the database file at abs.
func acquireHub(abs string) *changeHub {
	hubsMu.Lock()
	defer hubsMu.Unlock()
	h := hubs[abs]
	if h == nil {
		h = &changeHub{watch: map[*watcher]struct{}{}}
		hubs[abs] = h
	}
	h.refs++
	return h
}

// releaseHub drops a handle's reference to the hub of abs.
func releaseHub(abs string) {
	hubsMu.Lock()
	defer hubsMu.Unlock()
	if h := hubs[abs]; h != nil {
		if h.refs--; h.refs == 0 {
			delete(hubs, abs)
		}
	}
}

// announce tells every watcher of a committed change of kind to nodes
// (none: every node).
func (h *changeHub) announce(kind store.ChangeKind, nodes ...string) {
	c := store.Change{Kind: kind}
	if len(nodes) > 0 {
		c.Nodes = nodes
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watch {
		w.notify(c)
	}
}

// WatchChanges announces store.ChangeAll for every node once it is
// registered, then each change committed through any handle on this file,
// until ctx ends; it returns nil. notify must not block. There is no
// connection to lose: the broadcast is in process.
func (s *SQLite) WatchChanges(ctx context.Context, notify func(store.Change)) error {
	w := &watcher{notify: notify}
	s.hub.mu.Lock()
	s.hub.watch[w] = struct{}{}
	s.hub.mu.Unlock()
	defer func() {
		s.hub.mu.Lock()
		delete(s.hub.watch, w)
		s.hub.mu.Unlock()
	}()
	notify(store.Change{Kind: store.ChangeAll})
	<-ctx.Done()
	return nil
}
