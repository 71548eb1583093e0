package authority

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// closingStore records CloseAgentStream calls, failing them while down.
type closingStore struct {
	store.Store
	down   atomic.Bool
	mu     sync.Mutex
	closed map[string]time.Time
}

func (c *closingStore) CloseAgentStream(_ context.Context, node string, connectedAt, lastSeen time.Time) error {
	if c.down.Load() {
		return fmt.Errorf("postgres: close agent stream: %w", store.ErrUnavailable)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed[node] = lastSeen
	return nil
}

// TestPendingStreamEnds: the end of a stream that could not be recorded
// (the store down) is recorded once the store is back, with the time it
// ended, and only once.
func TestPendingStreamEnds(t *testing.T) {
	st := &closingStore{closed: map[string]time.Time{}}
	st.down.Store(true)
	p := newPendingEnds(st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	opened, ended := time.Now().Add(-time.Minute), time.Now()
	p.add("n1", opened, ended)
	p.add("n2", opened, ended)
	p.flush(t.Context())
	if p.len() != 2 {
		t.Fatalf("%d ends pending after a failed flush, want 2", p.len())
	}
	st.down.Store(false)
	p.flush(t.Context())
	if p.len() != 0 || len(st.closed) != 2 || !st.closed["n1"].Equal(ended) {
		t.Fatalf("after the store came back: %d pending, recorded %v", p.len(), st.closed)
	}
}
