package task

import (
	"crypto/ed25519"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestPages: every node lands in exactly one page, in order, and each
// page signs into a task an agent named in it accepts (within MaxNodeIDs
// and MaxTaskBytes), whatever the IDs' length and the params' size.
func TestPages(t *testing.T) {
	f := newFixture(t)
	long := strings.Repeat("n", 58)
	cases := []struct {
		name      string
		nodes     int
		idFormat  string
		params    map[string]string
		wantPages int
	}{
		{"none", 0, "node-%05d", nil, 0},
		{"one", 1, "node-%05d", nil, 1},
		{"a full page", MaxNodeIDs, "node-%05d", nil, 1},
		{"one past a page", MaxNodeIDs + 1, "node-%05d", nil, 2},
		{"100k short IDs", 100_000, "node-%05d", nil, 98},
		{"63-character IDs are cut by size", 3 * MaxNodeIDs, long + "%05d", nil, 4},
		{"large params leave less room", 2000, "node-%05d", bigParams(10, MaxParamValue), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nodes := make([]string, c.nodes)
			for i := range nodes {
				nodes[i] = fmt.Sprintf(c.idFormat, i)
			}
			env := envelope("node.report")
			env.Params = map[string]string{}
			for k, v := range c.params {
				env.Params[k] = v
			}
			pages := env.Pages(nodes)
			if c.wantPages > 0 && len(pages) != c.wantPages {
				t.Fatalf("%d pages, want %d", len(pages), c.wantPages)
			}
			if got := slices.Concat(pages...); !slices.Equal(got, nodes) && len(nodes) > 0 {
				t.Fatalf("pages hold %d nodes, not the %d given in order", len(got), len(nodes))
			}
			for i, p := range pages {
				if len(p) == 0 || len(p) > MaxNodeIDs {
					t.Fatalf("page %d has %d nodes", i, len(p))
				}
				e := env
				e.Target = Target{NodeIDs: p}
				data := f.sign(t, e)
				v := f.verifier(t0)
				v.NodeID = p[len(p)-1]
				if _, err := v.Verify(data); err != nil {
					t.Fatalf("page %d: the last node it names refuses it: %v", i, err)
				}
			}
		})
	}
}

// TestSignRefusesWhatAgentsRefuse: a task that signs into more than
// MaxTaskBytes is refused before it is queued, since every agent would
// refuse it as malformed.
func TestSignRefusesWhatAgentsRefuse(t *testing.T) {
	f := newFixture(t)
	env := envelope("node.report")
	env.Params = map[string]string{}
	env.Params = bigParams(17, MaxParamValue)
	_, err := env.Sign(func(m []byte) ([]byte, error) { return ed25519.Sign(f.privs["v2"], m), nil })
	if err == nil || !strings.Contains(err.Error(), "an agent accepts") {
		t.Fatalf("Sign of a %d-param task: %v, want a refusal", len(env.Params), err)
	}
}

func bigParams(n, size int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("p%d", i)] = strings.Repeat("x", size)
	}
	return m
}
