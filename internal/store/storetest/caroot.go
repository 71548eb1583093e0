package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

func caRootCases() []testCase {
	return []testCase{
		{"a fresh store has no rotation; a written one comes back whole", func(t *testing.T, ctx context.Context, s store.Store) {
			r, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			if r.Version != 0 || r.Phase != store.RootPhaseNone || r.NewCertDER != nil || r.OldCertDER != nil {
				t.Fatalf("fresh store: %+v; want version 0, phase none, no roots", r)
			}
			before := storeNow(t, ctx, s)
			given := store.RootRotation{Phase: store.RootPhaseInit, NewCertDER: []byte("new"), NewKeyRef: []byte("sealed-new"),
				CrossNewByOld: []byte("x-new"), CrossOldByNew: []byte("x-old")}
			mustNil(t, "PutRootRotation", s.PutRootRotation(ctx, r, given, true, link(record("ca.root_phase"))))
			got, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			if got.Version != 1 || got.StartedAt.Before(before) || got.ChangedAt.Before(before) {
				t.Fatalf("after the first write: version %d started %v changed %v; want 1 and the store clock from %v", got.Version, got.StartedAt, got.ChangedAt, before)
			}
			given.Version, given.StartedAt, given.ChangedAt = got.Version, got.StartedAt, got.ChangedAt
			if diff := cmp.Diff(given, got, cmpOpts...); diff != "" {
				t.Fatalf("rotation (-written +read):\n%s", diff)
			}
			// A phase change keeps StartedAt; a restart sets it again.
			next := got
			next.Phase = store.RootPhaseUpdateAgents
			mustNil(t, "PutRootRotation next phase", s.PutRootRotation(ctx, got, next, false, link(record("ca.root_phase"))))
			got, err = s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			if got.Version != 2 || got.Phase != store.RootPhaseUpdateAgents || !got.StartedAt.Equal(next.StartedAt) || got.ChangedAt.Before(next.ChangedAt) {
				t.Fatalf("after a phase change: %+v; want version 2, update_agents, started kept", got)
			}
			// Clearing fields writes NULLs.
			cleared := store.RootRotation{Phase: store.RootPhaseNone, OldCertDER: []byte("old"), OldKeyRef: []byte("sealed-old")}
			mustNil(t, "PutRootRotation clear", s.PutRootRotation(ctx, got, cleared, true, link(record("ca.root_phase"))))
			got, err = s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			if got.NewCertDER != nil || got.NewKeyRef != nil || got.CrossNewByOld != nil || got.CrossOldByNew != nil || string(got.OldCertDER) != "old" {
				t.Fatalf("after clearing: %+v; want the new root and cross-certificates gone, the old root kept", got)
			}
		}},
		{"a write from a stale version conflicts and writes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "PutRootRotation", s.PutRootRotation(ctx, store.RootRotation{}, store.RootRotation{Phase: store.RootPhaseInit, NewCertDER: []byte("a")}, true, link(record("ca.root_phase"))))
			wantErr(t, "a second first write", s.PutRootRotation(ctx, store.RootRotation{}, store.RootRotation{Phase: store.RootPhaseInit, NewCertDER: []byte("b")}, true, link(record("ca.root_phase"))), store.ErrConflict)
			first, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			never := first
			never.Version = 5
			wantErr(t, "a write from a version never stored", s.PutRootRotation(ctx, never, store.RootRotation{Phase: store.RootPhaseStandby}, false, link(record("ca.root_phase"))), store.ErrConflict)
			other := first
			other.ChangedAt = other.ChangedAt.Add(-time.Millisecond)
			wantErr(t, "a write from the stored version written at another time", s.PutRootRotation(ctx, other, store.RootRotation{Phase: store.RootPhaseStandby}, false, link(record("ca.root_phase"))), store.ErrConflict)
			got, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			if got.Version != 1 || got.Phase != store.RootPhaseInit || string(got.NewCertDER) != "a" {
				t.Fatalf("after conflicting writes: %+v; want the first write's", got)
			}
			if err := s.PutRootRotation(ctx, got, store.RootRotation{Phase: "sideways"}, false, link(record("ca.root_phase"))); err == nil {
				t.Fatal("a phase outside the five was written")
			}
		}},
		{"of concurrent phase changes from one version exactly one succeeds", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "PutRootRotation", s.PutRootRotation(ctx, store.RootRotation{}, store.RootRotation{Phase: store.RootPhaseInit}, true, link(record("ca.root_phase"))))
			first, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			const n = 8
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				to := store.RootPhaseUpdateAgents
				if i%2 == 1 {
					to = store.RootPhaseNone // a rollback racing the next phase
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- s.PutRootRotation(ctx, first, store.RootRotation{Phase: to}, false, link(record("ca.root_phase")))
				}()
			}
			wg.Wait()
			close(errs)
			ok := 0
			for err := range errs {
				if err == nil {
					ok++
					continue
				}
				wantErr(t, "concurrent phase change", err, store.ErrConflict)
			}
			if ok != 1 {
				t.Fatalf("%d of %d concurrent phase changes succeeded, want exactly one", ok, n)
			}
			if got, err := s.GetRootRotation(ctx); err != nil || got.Version != 2 {
				t.Fatalf("after the race: %+v, %v; want version 2", got, err)
			}
		}},
		{"discard retires a prepared intermediate only", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("server", "s1", store.CAActive), link(record("ca.prepare"))))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("server", "s2", store.CAPrepared), link(record("ca.prepare"))))
			wantErr(t, "discard the active one", second(s.DiscardCACert(ctx, "server", "s1", link(record("ca.discard")))), store.ErrConflict)
			wantErr(t, "discard under another role", second(s.DiscardCACert(ctx, "agent", "s2", link(record("ca.discard")))), store.ErrConflict)
			ref, err := s.DiscardCACert(ctx, "server", "s2", link(record("ca.discard")))
			mustNil(t, "DiscardCACert", err)
			if string(ref) != "sealed-s2" {
				t.Errorf("DiscardCACert returned the key reference %q, want its own, %q", ref, "sealed-s2")
			}
			wantErr(t, "discard twice", second(s.DiscardCACert(ctx, "server", "s2", link(record("ca.discard")))), store.ErrConflict)
			rows, err := s.ListCACerts(ctx)
			mustNil(t, "ListCACerts", err)
			for _, r := range rows {
				if r.Serial == "s2" && string(r.KeyRef) != "sealed-s2" {
					t.Errorf("discarded s2 has the key reference %q; want sealed-s2 kept until its key is destroyed", r.KeyRef)
				}
			}
			want := map[string]string{"s1": "active", "s2": "retired"}
			if got := caStates(t, ctx, s); !cmp.Equal(got, want) {
				t.Fatalf("states %v, want %v", got, want)
			}
			// The role may prepare again.
			mustNil(t, "InsertCACert after discard", s.InsertCACert(ctx, caRow("server", "s3", store.CAPrepared), link(record("ca.prepare"))))
		}},
	}
}
