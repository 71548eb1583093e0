package cli

import (
	"testing"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestQueuedNodes: a send's count is node_count when the authority gives
// it (its node_ids then list the first 1,000 at most), and the IDs listed
// from an authority from before node_count, which listed every node.
func TestQueuedNodes(t *testing.T) {
	for _, tt := range []struct {
		name string
		resp *musterv1.SendTaskResponse
		want int
	}{
		{"a count beside the first IDs", &musterv1.SendTaskResponse{NodeIds: []string{"a", "b"}, NodeCount: 100000}, 100000},
		{"an authority from before node_count", &musterv1.SendTaskResponse{NodeIds: []string{"a", "b", "c"}}, 3},
		{"no nodes", &musterv1.SendTaskResponse{}, 0},
	} {
		if got := queuedNodes(tt.resp); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}
