package cli

import (
	"strings"
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

// TestPrintSent: the count of nodes a send was queued for takes its
// plural only when it is not one.
func TestPrintSent(t *testing.T) {
	for _, tt := range []struct {
		resp *musterv1.SendTaskResponse
		want string
	}{
		{&musterv1.SendTaskResponse{TaskId: "t1", NodeIds: []string{"a"}, SignerVersionId: "s1"}, "queued for 1 node until"},
		{&musterv1.SendTaskResponse{TaskId: "t1", NodeCount: 2, SignerVersionId: "s1"}, "queued for 2 nodes until"},
		{&musterv1.SendTaskResponse{TaskId: "t1", SignerVersionId: "s1"}, "queued for 0 nodes until"},
		{&musterv1.SendTaskResponse{TaskIds: []string{"t1", "t2"}, NodeCount: 1001, SignerVersionId: "s1"}, "queued for 1001 nodes until"},
	} {
		var b strings.Builder
		printSent(&b, tt.resp, "node.report")
		if !strings.Contains(b.String(), tt.want) {
			t.Errorf("printSent(%v) = %q, want %q in it", tt.resp, b.String(), tt.want)
		}
	}
}
