package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

func signerRow(id, state string, published time.Duration) store.Signer {
	return store.Signer{
		VersionID: id, PublicKey: []byte("pub-" + id), KeyRef: []byte("sealed-" + id), State: state,
		PublishedAt: at(published), EffectiveAt: at(published + time.Hour),
	}
}

func insert(s store.Signer) store.SignerChange { return store.SignerChange{To: s} }

func move(s store.Signer, from, to string) store.SignerChange {
	s.State = from
	c := store.SignerChange{From: from, To: s}
	c.To.State = to
	return c
}

// signerStates lists signers as id=state, failing if a live state repeats.
func signerStates(t *testing.T, ctx context.Context, s store.Store) (map[string]string, int64) {
	t.Helper()
	rows, id, err := s.ListSigners(ctx)
	mustNil(t, "ListSigners", err)
	v := id.Version
	m, live := map[string]string{}, map[string]int{}
	for _, r := range rows {
		m[r.VersionID] = r.State
		if live[r.State]++; r.State != store.SignerRetired && r.State != store.SignerRevoked && live[r.State] > 1 {
			t.Fatalf("two signers %s: %v", r.State, m)
		}
	}
	return m, v
}

// signerRefs lists the signers' key references by version.
func signerRefs(t *testing.T, ctx context.Context, s store.Store) map[string][]byte {
	t.Helper()
	rows, _, err := s.ListSigners(ctx)
	mustNil(t, "ListSigners", err)
	m := map[string][]byte{}
	for _, r := range rows {
		m[r.VersionID] = r.KeyRef
	}
	return m
}

func signerCases() []testCase {
	return []testCase{
		{"empty", func(t *testing.T, ctx context.Context, s store.Store) {
			rows, v, err := s.ListSigners(ctx)
			mustNil(t, "ListSigners", err)
			if len(rows) != 0 || v != (store.SignerSetID{}) {
				t.Fatalf("ListSigners = %v, %+v; want none at version 0", rows, v)
			}
		}},
		{"the ID read alone is ListSigners' ID; each step stamps it with the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			id, err := s.SignerSetID(ctx)
			mustNil(t, "SignerSetID", err)
			if id != (store.SignerSetID{}) {
				t.Fatalf("SignerSetID before any signer = %+v, want zero", id)
			}
			before := storeNow(t, ctx, s)
			a := signerRow("v1", store.SignerActive, 0)
			_, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(a)}, stepLink)
			mustNil(t, "create", err)
			after := storeNow(t, ctx, s)
			first, err := s.SignerSetID(ctx)
			mustNil(t, "SignerSetID", err)
			if stamp := time.UnixMicro(first.SteppedAt); stamp.Before(before.Add(-time.Millisecond)) || stamp.After(after.Add(time.Millisecond)) {
				t.Errorf("stepped at %s, want between %s and %s (the store clock)", stamp, before, after)
			}
			_, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(signerRow("v2", store.SignerStaged, 0))}, stepLink)
			if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("stale step: %v, want ErrConflict", err)
			}
			got, err := s.SignerSetID(ctx)
			mustNil(t, "SignerSetID", err)
			_, listed, err := s.ListSigners(ctx)
			mustNil(t, "ListSigners", err)
			if got != first || listed != first || got.Version != 1 {
				t.Fatalf("SignerSetID = %+v, ListSigners %+v, after the first step %+v; want version 1 (a refused step changes nothing)", got, listed, first)
			}
		}},
		{"insert and read back every field", func(t *testing.T, ctx context.Context, s store.Store) {
			a := signerRow("v1", store.SignerActive, 0)
			b := signerRow("v2", store.SignerStaged, time.Minute)
			b.GraceUntil, b.Previous = at(25*time.Hour), "v1"
			v, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(a)}, stepLink)
			mustNil(t, "create", err)
			v, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, v), []store.SignerChange{insert(b)}, stepLink)
			mustNil(t, "stage", err)
			rows, got, err := s.ListSigners(ctx)
			mustNil(t, "ListSigners", err)
			if got.Version != 2 || v != 2 {
				t.Errorf("version = %d (returned %d), want 2", got, v)
			}
			if diff := cmp.Diff([]store.Signer{a, b}, rows, cmpOpts); diff != "" {
				t.Errorf("ListSigners (-want +got):\n%s", diff)
			}
		}},
		{"a full rotation, each step conditional", func(t *testing.T, ctx context.Context, s store.Store) {
			a, b := signerRow("v1", store.SignerActive, 0), signerRow("v2", store.SignerStaged, time.Minute)
			v, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(a)}, stepLink)
			mustNil(t, "create", err)
			v, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, v), []store.SignerChange{insert(b)}, stepLink)
			mustNil(t, "stage", err)
			demote := move(a, store.SignerActive, store.SignerGrace)
			demote.To.RetiresAt = at(25 * time.Hour)
			v, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, v), []store.SignerChange{demote, move(b, store.SignerStaged, store.SignerActive)}, stepLink)
			mustNil(t, "activate", err)
			retire := move(demote.To, store.SignerGrace, store.SignerRetired)
			retire.To.EndedAt = at(26 * time.Hour)
			_, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, v), []store.SignerChange{retire}, stepLink)
			mustNil(t, "retire", err)
			m, got := signerStates(t, ctx, s)
			if diff := cmp.Diff(map[string]string{"v1": store.SignerRetired, "v2": store.SignerActive}, m); diff != "" || got != 4 {
				t.Errorf("after rotation, version %d:\n%s", got, diff)
			}
			rows, _, _ := s.ListSigners(ctx)
			if !rows[0].EndedAt.Equal(at(26*time.Hour)) || !rows[0].RetiresAt.Equal(at(25*time.Hour)) {
				t.Errorf("retired row = %+v", rows[0])
			}
		}},
		{"refusals write nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			a := signerRow("v1", store.SignerActive, 0)
			_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(a)}, stepLink)
			mustNil(t, "create", err)
			for name, tc := range map[string]struct {
				version int64
				changes []store.SignerChange
			}{
				"stale version":            {0, []store.SignerChange{insert(signerRow("v2", store.SignerStaged, 0))}},
				"future version":           {5, []store.SignerChange{insert(signerRow("v2", store.SignerStaged, 0))}},
				"row not in from state":    {1, []store.SignerChange{insert(signerRow("v2", store.SignerStaged, 0)), move(a, store.SignerGrace, store.SignerRetired)}},
				"unknown row":              {1, []store.SignerChange{move(signerRow("v9", "", 0), store.SignerStaged, store.SignerActive)}},
				"second active":            {1, []store.SignerChange{insert(signerRow("v2", store.SignerActive, 0))}},
				"duplicate version ID":     {1, []store.SignerChange{insert(signerRow("v1", store.SignerStaged, 0))}},
				"activate before demoting": {1, []store.SignerChange{insert(signerRow("v2", store.SignerStaged, 0)), move(signerRow("v2", "", 0), store.SignerStaged, store.SignerActive)}},
			} {
				_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, tc.version), tc.changes, stepLink)
				if !errors.Is(err, store.ErrConflict) {
					t.Errorf("%s: %v, want ErrConflict", name, err)
				}
				m, v := signerStates(t, ctx, s)
				if diff := cmp.Diff(map[string]string{"v1": store.SignerActive}, m); diff != "" || v != 1 {
					t.Fatalf("%s wrote something: version %d\n%s", name, v, diff)
				}
			}
		}},
		{"concurrent first signers: exactly one is created", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 8
			errs := make([]error, n)
			var wg sync.WaitGroup
			from := idAt(t, ctx, s, 0)
			for i := range n {
				wg.Go(func() {
					_, errs[i] = s.ApplySignerChanges(ctx, from, []store.SignerChange{insert(signerRow(fmt.Sprintf("r%d", i), store.SignerActive, 0))}, stepLink)
				})
			}
			wg.Wait()
			wins := successes(t, "replica", errs)
			m, v := signerStates(t, ctx, s)
			if wins != 1 || len(m) != 1 || v != 1 {
				t.Fatalf("%d creations won, signers %v at version %d; want exactly one", wins, m, v)
			}
		}},
		{"concurrent changes from one version: exactly one applies", func(t *testing.T, ctx context.Context, s store.Store) {
			a, b := signerRow("v1", store.SignerActive, 0), signerRow("v2", store.SignerStaged, time.Minute)
			_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(a)}, stepLink)
			mustNil(t, "create", err)
			v, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 1), []store.SignerChange{insert(b)}, stepLink)
			mustNil(t, "stage", err)
			// Half activate the staged signer, half discard it (a rollback):
			// whichever commits first, the others find the version moved.
			activate := []store.SignerChange{move(a, store.SignerActive, store.SignerGrace), move(b, store.SignerStaged, store.SignerActive)}
			discard := []store.SignerChange{move(b, store.SignerStaged, store.SignerRetired)}
			const n = 8
			errs := make([]error, n)
			var wg sync.WaitGroup
			from := idAt(t, ctx, s, v)
			for i := range n {
				changes := activate
				if i%2 == 1 {
					changes = discard
				}
				wg.Go(func() { _, errs[i] = s.ApplySignerChanges(ctx, from, changes, stepLink) })
			}
			wg.Wait()
			wins := successes(t, "change", errs)
			m, got := signerStates(t, ctx, s)
			if wins != 1 || got != 3 {
				t.Fatalf("%d changes won, version %d, signers %v; want exactly one", wins, got, m)
			}
			if m["v2"] != store.SignerActive && m["v2"] != store.SignerRetired {
				t.Fatalf("signers %v", m)
			}
		}},
		{"a step that ends a signer drops its key in the same write, and only such a step", func(t *testing.T, ctx context.Context, s store.Store) {
			a, b := signerRow("v1", store.SignerActive, 0), signerRow("v2", store.SignerStaged, time.Minute)
			_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(a), insert(b)}, stepLink)
			mustNil(t, "create and stage", err)
			keep := move(a, store.SignerActive, store.SignerGrace)
			keep.DropKey = true
			if _, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 1), []store.SignerChange{keep}, stepLink); err == nil {
				t.Fatal("a step to grace dropped the key of a signer that still signs")
			}
			discard := move(b, store.SignerStaged, store.SignerRetired)
			discard.DropKey = true
			_, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, 1), []store.SignerChange{discard}, stepLink)
			mustNil(t, "discard with its key", err)
			refs := signerRefs(t, ctx, s)
			if len(refs["v2"]) != 0 || string(refs["v1"]) != "sealed-v1" {
				t.Fatalf("key references after the discard: %q; want v2's gone, v1's kept", refs)
			}
		}},
		{"an unaudited step, advance or key drop changes nothing; an audited one writes its record", func(t *testing.T, ctx context.Context, s store.Store) {
			rows := func() any {
				r, id, err := s.ListSigners(ctx)
				mustNil(t, "ListSigners", err)
				return fmt.Sprintf("%+v at %d", r, id.Version)
			}
			a, b := signerRow("v1", store.SignerActive, 0), signerRow("v2", store.SignerStaged, time.Minute)
			b.KeyRef = []byte("pkcs11:token=t;object=muster-signer%2Fv2;id=%01")
			create := []store.SignerChange{insert(a), insert(b)}
			wantUnaudited(t, ctx, s, "node_task_signer.create", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), create, audit)
				return err
			}, rows)
			seq := auditSeq(t, ctx, s)
			v, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), create, link(record("node_task_signer.create")))
			mustNil(t, "ApplySignerChanges with its record", err)
			wantAppended(t, ctx, s, seq, "node_task_signer.create")
			// A step that lost (the version moved) writes no record.
			_, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(signerRow("v3", store.SignerRetired, 0))}, link(record("node_task_signer.create")))
			wantErr(t, "ApplySignerChanges from a version gone", err, store.ErrConflict)
			wantAppended(t, ctx, s, seq, "node_task_signer.create")

			discard := []store.SignerChange{move(b, store.SignerStaged, store.SignerRetired)}
			wantUnaudited(t, ctx, s, "node_task_signer.rollback", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, v), discard, audit)
				return err
			}, rows)
			v, err = s.ApplySignerChanges(ctx, idAt(t, ctx, s, v), discard, stepLink)
			mustNil(t, "discard", err)

			wantUnaudited(t, ctx, s, "node_task_signer.destroy_key", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.DropSignerKey(ctx, "v2", b.KeyRef, audit)
			}, rows)
			seq = auditSeq(t, ctx, s)
			mustNil(t, "DropSignerKey with its record", s.DropSignerKey(ctx, "v2", b.KeyRef, link(record("node_task_signer.destroy_key"))))
			wantAppended(t, ctx, s, seq, "node_task_signer.destroy_key")
			wantErr(t, "DropSignerKey again", s.DropSignerKey(ctx, "v2", b.KeyRef, link(record("node_task_signer.destroy_key"))), store.ErrConflict)
			wantAppended(t, ctx, s, seq, "node_task_signer.destroy_key")

			wantUnaudited(t, ctx, s, "node_task_signer.advance", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.AdvanceSignerSet(ctx, idAt(t, ctx, s, v), v+5, []byte("set"), audit)
			}, rows)
			seq = auditSeq(t, ctx, s)
			if sets, err := s.VerifierSets(ctx, 0, 100); err != nil || len(sets) != 0 {
				t.Fatalf("an advance refused for its record kept sets %v (%v)", sets, err)
			}
			mustNil(t, "AdvanceSignerSet with its record", s.AdvanceSignerSet(ctx, idAt(t, ctx, s, v), v+5, []byte("set"), link(record("node_task_signer.advance"))))
			wantAppended(t, ctx, s, seq, "node_task_signer.advance")
			if _, got := signerStates(t, ctx, s); got != v+5 {
				t.Fatalf("verifier set version %d after the advance; want %d", got, v+5)
			}
			if sets, err := s.VerifierSets(ctx, v, 100); err != nil || len(sets) != 1 || sets[0].Version != v+5 || string(sets[0].Raw) != "set" {
				t.Fatalf("kept sets after the advance: %v (%v); want its set at %d", sets, err, v+5)
			}
		}},
		{"dropping an ended signer's key: conditional on its state and reference; racing replicas drop it once", func(t *testing.T, ctx context.Context, s store.Store) {
			a, b := signerRow("v1", store.SignerActive, 0), signerRow("v2", store.SignerStaged, time.Minute)
			b.KeyRef = []byte("pkcs11:token=t;object=muster-signer%2Fv2;id=%01")
			_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(a), insert(b)}, stepLink)
			mustNil(t, "create and stage", err)
			if err := s.DropSignerKey(ctx, "v2", b.KeyRef, dropLink); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("dropping a staged signer's key: %v, want ErrConflict", err)
			}
			if err := s.DropSignerKey(ctx, "v1", a.KeyRef, dropLink); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("dropping the active signer's key: %v, want ErrConflict", err)
			}
			// Ended without DropKey: the token object outlives the step.
			v, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 1), []store.SignerChange{move(b, store.SignerStaged, store.SignerRetired)}, stepLink)
			mustNil(t, "discard", err)
			if err := s.DropSignerKey(ctx, "v2", []byte("pkcs11:token=t;object=muster-signer%2Fv2;id=%02"), dropLink); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("dropping with another reference: %v, want ErrConflict", err)
			}
			if err := s.DropSignerKey(ctx, "v9", b.KeyRef, dropLink); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("dropping a missing signer's key: %v, want ErrConflict", err)
			}
			const n = 6
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { errs[i] = s.DropSignerKey(ctx, "v2", b.KeyRef, dropLink) })
			}
			wg.Wait()
			if wins := successes(t, "drop", errs); wins != 1 {
				t.Fatalf("%d drops won, want 1", wins)
			}
			refs := signerRefs(t, ctx, s)
			if len(refs["v2"]) != 0 || string(refs["v1"]) != "sealed-v1" {
				t.Fatalf("key references after the drop: %q; want v2's gone, v1's kept", refs)
			}
			if _, got := signerStates(t, ctx, s); got != v {
				t.Fatalf("dropping a key moved the verifier set version from %d to %d", v, got)
			}
		}},
		{"published verifier sets: kept for the current set ID, the first of a version; listed after a version, oldest first", func(t *testing.T, ctx context.Context, s store.Store) {
			for v := int64(1); v <= 4; v++ {
				id := step(t, ctx, s, v)
				mustNil(t, "PutVerifierSet", s.PutVerifierSet(ctx, id, []byte(fmt.Sprintf("set-%d", v))))
				mustNil(t, "PutVerifierSet again", s.PutVerifierSet(ctx, id, []byte("other")))
			}
			got, err := s.VerifierSets(ctx, 1, 2)
			mustNil(t, "VerifierSets", err)
			want := []store.PublishedSet{{Version: 2, Raw: []byte("set-2")}, {Version: 3, Raw: []byte("set-3")}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("VerifierSets(1, 2) (-want +got):\n%s", diff)
			}
			if got, err := s.VerifierSets(ctx, 4, 10); err != nil || len(got) != 0 {
				t.Fatalf("VerifierSets(4) = %v, %v; want none", got, err)
			}
		}},
		{"advancing the set version: conditional, forward only, racing advances make one", func(t *testing.T, ctx context.Context, s store.Store) {
			_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, 0), []store.SignerChange{insert(signerRow("v1", store.SignerActive, 0))}, stepLink)
			mustNil(t, "create", err)
			set := func(v int64) []byte { return []byte(fmt.Sprintf("set-%d", v)) }
			if err := s.AdvanceSignerSet(ctx, idAt(t, ctx, s, 1), 1, set(1), advanceLink); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("advance to the same version: %v, want ErrConflict", err)
			}
			if err := s.AdvanceSignerSet(ctx, idAt(t, ctx, s, 1), 2, nil, advanceLink); err == nil {
				t.Fatal("advance with no signed set: no error")
			}
			const n = 6
			errs := make([]error, n)
			var wg sync.WaitGroup
			from := idAt(t, ctx, s, 1)
			for i := range n {
				wg.Go(func() { errs[i] = s.AdvanceSignerSet(ctx, from, int64(10+i), set(int64(10+i)), advanceLink) })
			}
			wg.Wait()
			if wins := successes(t, "advance", errs); wins != 1 {
				t.Fatalf("%d advances won, want 1", wins)
			}
			id, err := s.SignerSetID(ctx)
			mustNil(t, "SignerSetID", err)
			if id.Version < 10 || id.SteppedAt == 0 {
				t.Fatalf("set ID %+v after the advance", id)
			}
			// The version never moves without its set: the winner's is
			// kept at its version, the losers' nowhere, and a put at the
			// advanced ID keeps it.
			mustNil(t, "PutVerifierSet at the advanced ID", s.PutVerifierSet(ctx, id, []byte("other")))
			sets, err := s.VerifierSets(ctx, 1, 100)
			mustNil(t, "VerifierSets", err)
			if diff := cmp.Diff([]store.PublishedSet{{Version: id.Version, Raw: set(id.Version)}}, sets); diff != "" {
				t.Fatalf("kept sets after racing advances (-want +got):\n%s", diff)
			}
			if err := s.AdvanceSignerSet(ctx, idAt(t, ctx, s, 1), 20, set(20), advanceLink); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("advance from a stale version: %v, want ErrConflict", err)
			}
			if err := s.AdvanceSignerSet(ctx, idAt(t, ctx, s, id.Version), store.MaxSignerSetVersion, set(0), advanceLink); !errors.Is(err, store.ErrSetVersionExhausted) {
				t.Fatalf("advance to MaxInt64/2: %v, want ErrSetVersionExhausted", err)
			}
			if err := s.AdvanceSignerSet(ctx, idAt(t, ctx, s, id.Version), store.MaxSignerSetVersion-1, set(0), advanceLink); err != nil {
				t.Fatalf("advance to just below the bound: %v", err)
			}
			if _, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, store.MaxSignerSetVersion-1), []store.SignerChange{insert(signerRow("v2", store.SignerStaged, 0))}, stepLink); !errors.Is(err, store.ErrSetVersionExhausted) {
				t.Fatalf("a step to MaxInt64/2: %v, want ErrSetVersionExhausted", err)
			}
		}},
		{"a verifier set is kept only while the set ID it was signed at is the store's", func(t *testing.T, ctx context.Context, s store.Store) {
			first := step(t, ctx, s, 1)
			// Read by a replica that signs the set of version 2 while
			// another steps to 3: the set is of a version gone.
			read := step(t, ctx, s, 2)
			cur := step(t, ctx, s, 3)
			for name, id := range map[string]store.SignerSetID{
				"a version gone":        read,
				"the first version":     first,
				"a version not reached": {Version: cur.Version + 1, SteppedAt: cur.SteppedAt},
				// The version alone is not the set: a restored store
				// stepped back up to it holds other signers.
				"the version, stepped at another time": {Version: cur.Version, SteppedAt: cur.SteppedAt - 1},
				"the version, never stepped":           {Version: cur.Version},
			} {
				if err := s.PutVerifierSet(ctx, id, []byte("stale")); !errors.Is(err, store.ErrConflict) {
					t.Errorf("%s: %v, want ErrConflict", name, err)
				}
			}
			if err := s.PutVerifierSet(ctx, cur, nil); err == nil {
				t.Error("an empty set kept")
			}
			if sets, err := s.VerifierSets(ctx, -1, 100); err != nil || len(sets) != 0 {
				t.Fatalf("refused puts kept %+v (%v)", sets, err)
			}
			mustNil(t, "PutVerifierSet at the current ID", s.PutVerifierSet(ctx, cur, []byte("current")))
			sets, err := s.VerifierSets(ctx, -1, 100)
			mustNil(t, "VerifierSets", err)
			if diff := cmp.Diff([]store.PublishedSet{{Version: cur.Version, Raw: []byte("current")}}, sets); diff != "" {
				t.Fatalf("kept sets (-want +got):\n%s", diff)
			}
		}},
		{"racing puts and steps: each put that returned no error left a set kept at its version, the first put there", func(t *testing.T, ctx context.Context, s store.Store) {
			ids := map[int64]store.SignerSetID{1: step(t, ctx, s, 1)}
			const putters, steps = 4, 6
			var (
				wg   sync.WaitGroup
				mu   sync.Mutex
				kept = map[int64][]string{}
			)
			stop := make(chan struct{})
			for p := range putters {
				wg.Go(func() {
					for n := 0; ; n++ {
						select {
						case <-stop:
							return
						default:
						}
						id, err := s.SignerSetID(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						raw := fmt.Sprintf("%d/%d by %d #%d", id.Version, id.SteppedAt, p, n)
						err = s.PutVerifierSet(ctx, id, []byte(raw))
						if err != nil && !errors.Is(err, store.ErrConflict) {
							t.Error(err)
							return
						}
						if err == nil {
							mu.Lock()
							kept[id.Version] = append(kept[id.Version], raw)
							mu.Unlock()
						}
					}
				})
			}
			for v := int64(2); v <= steps; v++ {
				ids[v] = step(t, ctx, s, v)
			}
			close(stop)
			wg.Wait()
			sets, err := s.VerifierSets(ctx, -1, 100)
			mustNil(t, "VerifierSets", err)
			got := map[int64]string{}
			for _, ps := range sets {
				got[ps.Version] = string(ps.Raw)
				prefix := fmt.Sprintf("%d/%d by ", ps.Version, ids[ps.Version].SteppedAt)
				if !strings.HasPrefix(string(ps.Raw), prefix) || !slices.Contains(kept[ps.Version], string(ps.Raw)) {
					t.Fatalf("kept %q at version %d, stepped to at %d; the puts that returned no error there: %q", ps.Raw, ps.Version, ids[ps.Version].SteppedAt, kept[ps.Version])
				}
			}
			for v, puts := range kept {
				if _, ok := got[v]; !ok {
					t.Fatalf("puts %q returned no error, and no set is kept at version %d", puts, v)
				}
			}
		}},
	}
}

// idAt is the set ID a caller that read version v holds: the store's
// ID if its version is v, else version v stepped at no time (a read
// gone stale, or never made).
func idAt(t *testing.T, ctx context.Context, s store.Store, v int64) store.SignerSetID {
	t.Helper()
	id, err := s.SignerSetID(ctx)
	mustNil(t, "SignerSetID", err)
	if id.Version != v {
		return store.SignerSetID{Version: v}
	}
	return id
}

// step makes verifier set version v (the store at v-1) with a signer
// change that breaks no rule (a retired signer inserted) and returns the
// store's set ID after it.
func step(t *testing.T, ctx context.Context, s store.Store, v int64) store.SignerSetID {
	t.Helper()
	_, err := s.ApplySignerChanges(ctx, idAt(t, ctx, s, v-1), []store.SignerChange{insert(signerRow(fmt.Sprintf("r%d", v), store.SignerRetired, 0))}, stepLink)
	mustNil(t, fmt.Sprintf("step to %d", v), err)
	id, err := s.SignerSetID(ctx)
	mustNil(t, "SignerSetID", err)
	if id.Version != v {
		t.Fatalf("stepped to %+v, want version %d", id, v)
	}
	return id
}

// successes counts the nil errors of concurrent attempts and fails the
// test for any error other than ErrConflict: the losers of a race that
// must happen once conflict, and nothing else.
func successes(t *testing.T, what string, errs []error) int {
	t.Helper()
	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, store.ErrConflict):
			t.Errorf("%s %d: %v, want ErrConflict", what, i, err)
		}
	}
	return wins
}

// RunSignerVersionTests checks that the verifier set version read through
// one store handle follows every step committed through another handle of
// the same database at once (two replicas): the authority serves the set
// it signed for a version only while the store is at that version.
// newPair is as for RunWatchTests.
func RunSignerVersionTests(t *testing.T, newPair func(t *testing.T) (reader, writer store.Store)) {
	t.Helper()
	ctx := t.Context()
	r, w := newPair(t)
	steps := [][]store.SignerChange{
		{insert(signerRow("v1", store.SignerActive, 0))},
		{insert(signerRow("v2", store.SignerStaged, time.Minute))},
		{move(signerRow("v1", "", 0), store.SignerActive, store.SignerGrace), move(signerRow("v2", "", time.Minute), store.SignerStaged, store.SignerActive)},
	}
	for i, changes := range steps {
		v, err := w.ApplySignerChanges(ctx, idAt(t, ctx, w, int64(i)), changes, stepLink)
		mustNil(t, "ApplySignerChanges", err)
		id, err := r.SignerSetID(ctx)
		mustNil(t, "SignerSetID", err)
		if got := id.Version; got != v {
			t.Fatalf("step %d through one handle made version %d; the other reads %d", i+1, v, got)
		}
	}
}

// RunLeftoverSetTests checks that verifier sets kept above the store's
// version, which no conditional put of this release writes (a replica of
// an older release, whose put was not conditional, or an earlier life of
// a restored store), are never listed and go with the next step or
// advance, so the version they sit at is signed afresh. plant writes such
// a set directly into s's table.
func RunLeftoverSetTests(t *testing.T, s store.Store, plant func(t *testing.T, version int64, raw []byte)) {
	t.Helper()
	ctx := t.Context()
	list := func(what string, want ...store.PublishedSet) {
		t.Helper()
		got, err := s.VerifierSets(ctx, 0, 100)
		mustNil(t, "VerifierSets", err)
		if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
			t.Fatalf("%s: kept sets (-want +got):\n%s", what, diff)
		}
	}
	set := func(v int64, raw string) store.PublishedSet { return store.PublishedSet{Version: v, Raw: []byte(raw)} }
	id := step(t, ctx, s, 1)
	mustNil(t, "PutVerifierSet", s.PutVerifierSet(ctx, id, []byte("set-1")))
	for _, v := range []int64{2, 3, 5} {
		plant(t, v, []byte(fmt.Sprintf("left-%d", v)))
	}
	list("sets left above the version", set(1, "set-1"))
	id = step(t, ctx, s, 2)
	list("after a step", set(1, "set-1"))
	mustNil(t, "PutVerifierSet", s.PutVerifierSet(ctx, id, []byte("set-2")))
	list("after a step and its set", set(1, "set-1"), set(2, "set-2"))
	for _, v := range []int64{3, 4, 6} {
		plant(t, v, []byte(fmt.Sprintf("left-%d", v)))
	}
	mustNil(t, "AdvanceSignerSet", s.AdvanceSignerSet(ctx, idAt(t, ctx, s, 2), 5, []byte("advanced-5"), advanceLink))
	list("after an advance", set(1, "set-1"), set(2, "set-2"), set(5, "advanced-5"))
	step(t, ctx, s, 6)
	list("after a step past a set left there", set(1, "set-1"), set(2, "set-2"), set(5, "advanced-5"))
}

// RestorableStore is a fresh store with direct access to its verifier
// set tables. RollBack puts the signer_set row back to to and drops the
// sets kept above its version, as a restored backup holds them. Plant
// writes a set directly into the table at version, stamped with
// steppedAt (nil: written without a step time, as a replica of the
// release before migration 0026 writes it), replacing any kept there.
type RestorableStore struct {
	store.Store
	RollBack func(t *testing.T, to store.SignerSetID)
	Plant    func(t *testing.T, version int64, steppedAt *int64, raw []byte)
}

// RunRestoredSetTests checks the steps, advances and kept sets of a store
// rolled back to an earlier snapshot under a running replica (restored
// from a backup) and stepped back up to a version the replica read before
// the restore, with other signers: the version alone repeats, the set ID
// does not. open returns a fresh store for each case.
func RunRestoredSetTests(t *testing.T, open func(t *testing.T) RestorableStore) {
	t.Helper()
	for _, tc := range restoredSetCases() {
		t.Run(tc.name, func(t *testing.T) {
			rs := open(t)
			tc.run(t, t.Context(), rs)
		})
	}
}

type restoredSetCase struct {
	name string
	run  func(t *testing.T, ctx context.Context, rs RestorableStore)
}

func restoredSetCases() []restoredSetCase {
	list := func(t *testing.T, ctx context.Context, s store.Store, what string, want ...store.PublishedSet) {
		t.Helper()
		got, err := s.VerifierSets(ctx, 0, 100)
		mustNil(t, "VerifierSets", err)
		if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
			t.Fatalf("%s: kept sets (-want +got):\n%s", what, diff)
		}
	}
	set := func(v int64, raw string) store.PublishedSet { return store.PublishedSet{Version: v, Raw: []byte(raw)} }
	// restoreAndStep reads version 2 as a replica does, rolls the store
	// back to version 1 and steps it to 2 again, with another signer: the
	// replica's read, and the new ID.
	restoreAndStep := func(t *testing.T, ctx context.Context, rs RestorableStore) (stale, again store.SignerSetID) {
		t.Helper()
		s := rs.Store
		first := step(t, ctx, s, 1)
		mustNil(t, "PutVerifierSet", s.PutVerifierSet(ctx, first, []byte("set-1")))
		stale = step(t, ctx, s, 2)
		mustNil(t, "PutVerifierSet", s.PutVerifierSet(ctx, stale, []byte("before-restore-2")))
		rs.RollBack(t, first)
		// The store clock counts milliseconds on SQLite: the step after
		// the restore is stamped after the one before it, as any step
		// made a restore later is.
		for !storeNow(t, ctx, s).After(time.UnixMicro(stale.SteppedAt)) {
			time.Sleep(time.Millisecond)
		}
		_, err := s.ApplySignerChanges(ctx, first, []store.SignerChange{insert(signerRow("after-restore-2", store.SignerRetired, 0))}, stepLink)
		mustNil(t, "step after the restore", err)
		again, err = s.SignerSetID(ctx)
		mustNil(t, "SignerSetID", err)
		if again.Version != 2 || again == stale {
			t.Fatalf("stepped back up to %+v; the read before the restore %+v; want version 2 at another time", again, stale)
		}
		return stale, again
	}
	return []restoredSetCase{
		{"a step or an advance from a read of version N is refused once N has been reached again with other content", func(t *testing.T, ctx context.Context, rs RestorableStore) {
			s := rs.Store
			stale, again := restoreAndStep(t, ctx, rs)
			before, _ := signerStates(t, ctx, s)
			_, err := s.ApplySignerChanges(ctx, stale, []store.SignerChange{insert(signerRow("late-3", store.SignerRetired, 0))}, stepLink)
			wantErr(t, "a step from the read before the restore", err, store.ErrConflict)
			wantErr(t, "an advance from the read before the restore", s.AdvanceSignerSet(ctx, stale, 10, []byte("late-10"), advanceLink), store.ErrConflict)
			after, v := signerStates(t, ctx, s)
			id, err := s.SignerSetID(ctx)
			mustNil(t, "SignerSetID", err)
			if diff := cmp.Diff(before, after); diff != "" || id != again || v != 2 {
				t.Fatalf("refused steps wrote something: set %+v (want %+v), signers (-before +after):\n%s", id, again, diff)
			}
			list(t, ctx, s, "after the refused steps", set(1, "set-1"))
			// The replica reads again and steps from what it read.
			v3, err := s.ApplySignerChanges(ctx, again, []store.SignerChange{insert(signerRow("r3", store.SignerRetired, 0))}, stepLink)
			mustNil(t, "a step from the read after the restore", err)
			if v3 != 3 {
				t.Fatalf("stepped to %d, want 3", v3)
			}
		}},
		{"a set kept at the current version for another step is neither listed nor kept; a put replaces it, a step drops it", func(t *testing.T, ctx context.Context, rs RestorableStore) {
			s, plant := rs.Store, rs.Plant
			stale, again := restoreAndStep(t, ctx, rs)
			// Kept for the step before the restore (a replica whose keep
			// landed between the restore and the step back up).
			plant(t, 2, &stale.SteppedAt, []byte("before-restore-2"))
			list(t, ctx, s, "a set of the step before the restore", set(1, "set-1"))
			mustNil(t, "PutVerifierSet at the current ID", s.PutVerifierSet(ctx, again, []byte("set-2")))
			list(t, ctx, s, "after a put at the current ID", set(1, "set-1"), set(2, "set-2"))
			mustNil(t, "PutVerifierSet again", s.PutVerifierSet(ctx, again, []byte("other")))
			list(t, ctx, s, "after a second put at the current ID", set(1, "set-1"), set(2, "set-2"))
			// A step from the current ID drops a set kept at the version
			// it leaves for another step time.
			plant(t, 2, &stale.SteppedAt, []byte("before-restore-2"))
			step(t, ctx, s, 3)
			list(t, ctx, s, "after a step from a version whose kept set is another step's", set(1, "set-1"))
		}},
		{"a set written without a step time at the current version is stamped with it (a replica of the release before 0026)", func(t *testing.T, ctx context.Context, rs RestorableStore) {
			s, plant := rs.Store, rs.Plant
			first := step(t, ctx, s, 1)
			plant(t, 1, nil, []byte("old-replica-1"))
			list(t, ctx, s, "a set kept by an old replica at the current ID", set(1, "old-replica-1"))
			mustNil(t, "PutVerifierSet at the current ID", s.PutVerifierSet(ctx, first, []byte("set-1")))
			list(t, ctx, s, "after a put at the ID the old replica kept", set(1, "old-replica-1"))
			// Above the version there is no step time to stamp: never
			// listed, and dropped by the next step.
			plant(t, 2, nil, []byte("old-replica-2"))
			step(t, ctx, s, 2)
			list(t, ctx, s, "after a step past an unstamped set", set(1, "old-replica-1"))
		}},
	}
}
