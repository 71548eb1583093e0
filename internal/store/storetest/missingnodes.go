package storetest

import (
	"context"
	"testing"

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
	}
}
