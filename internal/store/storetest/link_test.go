package storetest

import (
	"sync"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// TestLinkSharedByParallelTests: one link (stepLink) builds records for
// tests run in parallel, each on its own store's head; each gets the
// record for its head, and under -race the builds do not race on a
// record they share.
func TestLinkSharedByParallelTests(t *testing.T) {
	t.Parallel()
	build := link(record("test.shared"))
	var wg sync.WaitGroup
	got := make([]store.AuditRecord, 8)
	for i := range got {
		wg.Go(func() {
			r, err := build(store.AuditHead{Seq: int64(i), Hash: linkHash(nil, int64(i))})
			if err != nil {
				t.Error(err)
			}
			got[i] = r
		})
	}
	wg.Wait()
	for i, r := range got {
		if r.Seq != int64(i+1) || string(r.Hash) != string(linkHash(linkHash(nil, int64(i)), int64(i+1))) {
			t.Errorf("build on head %d: Seq %d, Hash %x", i, r.Seq, r.Hash)
		}
	}
}
