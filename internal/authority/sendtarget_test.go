package authority

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// A send whose target is of no kind, or of several, is refused as bad
// input before anything is read or signed — over the admin API any
// operator's client can send one, not only the CLI, which refuses it
// itself. (A target of no kind once resolved to no nodes and panicked.)
func TestSendTaskTargetKinds(t *testing.T) {
	b := startBench(t)
	a := &adminService{s: b.srvs[0]}
	for _, tt := range []struct {
		name string
		req  *musterv1.SendTaskRequest
	}{
		{"no target", &musterv1.SendTaskRequest{TaskType: "node.report"}},
		{"all and node IDs", &musterv1.SendTaskRequest{TaskType: "node.report", All: true, NodeIds: []string{"n1"}}},
		{"all and labels", &musterv1.SendTaskRequest{TaskType: "node.report", All: true, Labels: map[string]string{"a": "b"}}},
		{"node IDs and labels", &musterv1.SendTaskRequest{TaskType: "node.report", NodeIds: []string{"n1"},
			Labels: map[string]string{"a": "b"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.SendTask(t.Context(), tt.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("answered %v, want InvalidArgument", err)
			}
			if want := "exactly one of node IDs, labels or all"; !strings.Contains(status.Convert(err).Message(), want) {
				t.Errorf("answered %v, want it to say %q", err, want)
			}
		})
	}
}
