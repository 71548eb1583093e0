package authority

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// draftLosingStore, while lose is set, answers InsertCADraft with
// errLostCommit, having committed it first when commit is set.
type draftLosingStore struct {
	store.Store
	lose, commit atomic.Bool
}

func (s *draftLosingStore) InsertCADraft(ctx context.Context, d store.CADraft) error {
	if !s.lose.Load() {
		return s.Store.InsertCADraft(ctx, d)
	}
	if s.commit.Load() {
		if err := s.Store.InsertCADraft(ctx, d); err != nil {
			return err
		}
	}
	return errLostCommit
}

// TestDraftAfterAnAmbiguousCommit: a draft whose write's answer was lost
// (muster ca rotate ROLE --root-key FILE's first call) is read back: if
// the store holds it, the draft is answered and its key kept, so the
// signed certificate sent back is prepared; if it does not, the draft
// fails and its key is destroyed. Before, a draft recorded by a commit
// whose answer was lost was reported failed and its key destroyed,
// leaving a recorded draft with no key.
func TestDraftAfterAnAmbiguousCommit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		commit    bool
		wantErr   bool
		destroyed int
	}{
		{"the commit landed", true, false, 0},
		{"the commit did not land", false, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var destroyed []string
			var lost *draftLosingStore
			b := startReplicas(t, nil, 1, noCAClock, func(c *Config) {
				lost = &draftLosingStore{Store: c.Store}
				c.Store = lost
				c.WrapCACustody = countDestroys(&mu, &destroyed)
			})
			a := &adminService{s: b.srvs[0]}
			ctx := t.Context()
			lost.commit.Store(tc.commit)
			lost.lose.Store(true)
			d, err := a.DraftCAIntermediate(ctx, &musterv1.DraftCAIntermediateRequest{Role: "agent"})
			lost.lose.Store(false)
			mu.Lock()
			n := len(destroyed)
			mu.Unlock()
			if n != tc.destroyed {
				t.Errorf("%d keys destroyed (%q), want %d", n, destroyed, tc.destroyed)
			}
			drafts, lerr := b.store.ListCADrafts(ctx)
			if lerr != nil {
				t.Fatal(lerr)
			}
			if tc.wantErr {
				if err == nil {
					t.Fatal("DraftCAIntermediate succeeded with no draft recorded")
				}
				if len(drafts) != 0 {
					t.Fatalf("drafts %+v recorded, want none", drafts)
				}
				return
			}
			if err != nil {
				t.Fatalf("DraftCAIntermediate = %v, want the draft the store holds", err)
			}
			if len(drafts) != 1 || drafts[0].Serial != d.GetSerial() {
				t.Fatalf("drafts %+v, want the one answered (%s)", drafts, d.GetSerial())
			}
			if _, err := a.PrepareCAIntermediate(ctx, &musterv1.PrepareCAIntermediateRequest{Role: "agent", Serial: d.GetSerial(), KeyRef: d.GetKeyRef(),
				CertificateDer: signDraftWith(t, d, b.h.Root, b.h.RootKey, nil)}); err != nil {
				t.Fatalf("prepare from the draft: %v", err)
			}
		})
	}
}
