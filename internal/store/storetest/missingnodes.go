package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func missingNodesCases() []testCase {
	return []testCase{
		{"the IDs with no node, in the order given", func(t *testing.T, ctx context.Context, s store.Store) {
			for _, id := range []string{"node-a", "node-b"} {
				mustJoin(t, ctx, s, newJoin("", id, "inst-"+id, "key-"+id, at(0)))
			}
			got, err := s.MissingNodes(ctx, []string{"node-b", "gone-2", "node-a", "gone-1", "node-b", "gone-2"})
			mustNil(t, "MissingNodes", err)
			wantEqual(t, "MissingNodes", got, []string{"gone-2", "gone-1", "gone-2"})
			got, err = s.MissingNodes(ctx, []string{"node-a", "node-b"})
			mustNil(t, "MissingNodes", err)
			wantEqual(t, "MissingNodes of existing nodes", got, []string(nil))
			got, err = s.MissingNodes(ctx, nil)
			mustNil(t, "MissingNodes", err)
			wantEqual(t, "MissingNodes of none", got, []string(nil))
		}},
		{"the nodes whose join token carries every label of a selector", func(t *testing.T, ctx context.Context, s store.Store) {
			gpu, web, gone := token("tok-gpu", 10, time.Time{}, time.Hour), token("tok-web", 10, time.Time{}, time.Hour), token("tok-gone", 10, time.Time{}, time.Hour)
			gpu.Labels = map[string]string{"pool": "gpu", "env": "prod"}
			web.Labels = map[string]string{"pool": "web", "env": "prod", "a.b/c": "x"}
			gone.Labels = map[string]string{"pool": "gpu", "env": "prod"}
			insertTokens(t, ctx, s, gpu, web, gone)
			mustJoin(t, ctx, s, newJoin("tok-gpu", "gpu-2", "inst-gpu-2", "k1", at(0)))
			mustJoin(t, ctx, s, newJoin("tok-gpu", "gpu-1", "inst-gpu-1", "k2", at(0)))
			mustJoin(t, ctx, s, newJoin("tok-web", "web-1", "inst-web-1", "k3", at(0)))
			mustJoin(t, ctx, s, newJoin("", "psk-1", "inst-psk-1", "k4", at(0)))
			// A node whose join token was deleted is selected by no
			// label.
			mustJoin(t, ctx, s, newJoin("tok-gone", "moved-1", "inst-moved-1", "k5", at(0)))
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "tok-gone", link(record("token.delete"))))
			for _, c := range []struct {
				labels map[string]string
				want   []string
			}{
				{map[string]string{"pool": "gpu"}, []string{"gpu-1", "gpu-2"}},
				{map[string]string{"env": "prod"}, []string{"gpu-1", "gpu-2", "web-1"}},
				{map[string]string{"env": "prod", "pool": "web"}, []string{"web-1"}},
				{map[string]string{"a.b/c": "x"}, []string{"web-1"}},
				{map[string]string{"pool": "gpu", "env": "test"}, nil},
				{map[string]string{"pool": "GPU"}, nil},
				{map[string]string{"nowhere": ""}, nil},
			} {
				got, err := s.NodesWithLabels(ctx, c.labels)
				mustNil(t, "NodesWithLabels", err)
				wantEqual(t, fmt.Sprintf("NodesWithLabels(%v)", c.labels), got, c.want)
			}
		}},
	}
}
