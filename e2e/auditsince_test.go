package e2e

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// TestAuditListSince: `muster audit list --since T`, through the admin API
// and --offline, lists the records at or after T, with and without
// --action, the same as the whole chain filtered by time (the store finds
// the first one by a binary search on seq, docs/performance.md).
func TestAuditListSince(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	startAuthority(t, dir)
	for range 6 {
		mustRun(t, "token", "create", "--data", dir)
		time.Sleep(20 * time.Millisecond)
	}
	type rec struct {
		Seq    int64     `json:"seq"`
		Time   time.Time `json:"time"`
		Action string    `json:"action"`
	}
	list := func(args ...string) []rec {
		t.Helper()
		var rs []rec
		out := mustRun(t, append([]string{"audit", "list", "--data", dir, "-o", "json"}, args...)...)
		if err := json.Unmarshal([]byte(out), &rs); err != nil {
			t.Fatalf("audit list %v printed %q: %v", args, out, err)
		}
		return rs
	}
	all := list()
	if len(all) < 8 {
		t.Fatalf("%d records, want the init's, the start's and six token creations", len(all))
	}
	seqs := func(rs []rec) []int64 {
		var out []int64
		for _, r := range rs {
			out = append(out, r.Seq)
		}
		return out
	}
	for _, i := range []int{0, 3, len(all) - 2, len(all) - 1} {
		since := all[i].Time
		for _, action := range []string{"", "token.create"} {
			var want []int64
			for _, r := range all {
				if !r.Time.Before(since) && (action == "" || r.Action == action) {
					want = append(want, r.Seq)
				}
			}
			args := []string{"--since", since.Format(time.RFC3339Nano)}
			if action != "" {
				args = append(args, "--action", action)
			}
			for _, mode := range [][]string{nil, {"--offline"}} {
				if got := seqs(list(append(args, mode...)...)); !slices.Equal(got, want) {
					t.Errorf("audit list %v %v: seqs %v, want %v", args, mode, got, want)
				}
			}
		}
	}
}
