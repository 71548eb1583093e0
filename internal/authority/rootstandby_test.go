package authority

import (
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestStreamLive: standby waits only for streams open now. A row marked
// connected whose last heartbeat is older than streamStaleAfter is the
// stream of a replica that was killed, not waited for (walked: SIGKILL of
// the replica an agent streamed to left its row "connected via" it).
func TestStreamLive(t *testing.T) {
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		row  *store.AgentStream
		want bool
	}{
		{"never connected", nil, false},
		{"closed", &store.AgentStream{ConnectedAt: now.Add(-time.Minute), LastSeen: now}, false},
		{"heartbeat now", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Hour), LastSeen: now}, true},
		{"heartbeat at the limit", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Hour), LastSeen: now.Add(-streamStaleAfter)}, true},
		{"opened now, no heartbeat yet", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Second)}, true},
		{"replica killed", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Hour), LastSeen: now.Add(-streamStaleAfter - time.Second)}, false},
	} {
		if got := streamLive(tt.row, now); got != tt.want {
			t.Errorf("%s: streamLive = %v, want %v", tt.name, got, tt.want)
		}
	}
}
