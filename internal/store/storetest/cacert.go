package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/muster-dev/muster/internal/store"
)

func caRow(role, serial, state string) store.CACert {
	return store.CACert{Role: role, Serial: serial, CertDER: []byte("der-" + serial), KeyRef: []byte("sealed-" + serial),
		State: state, NotAfter: at(365 * 24 * time.Hour)}
}

// second is the error of a call that also returns a value.
func second[T any](_ T, err error) error { return err }

// caStates lists CA certificates as serial=state.
func caStates(t *testing.T, ctx context.Context, s store.Store) map[string]string {
	t.Helper()
	rows, err := s.ListCACerts(ctx)
	mustNil(t, "ListCACerts", err)
	m := map[string]string{}
	for _, r := range rows {
		m[r.Serial] = r.State
	}
	return m
}

func caCertCases() []testCase {
	return []testCase{
		{"inserted rows come back whole, times from the store clock where zero", func(t *testing.T, ctx context.Context, s store.Store) {
			rows, err := s.ListCACerts(ctx)
			mustNil(t, "ListCACerts", err)
			if len(rows) != 0 {
				t.Fatalf("a fresh store lists %d CA certificates", len(rows))
			}
			before := storeNow(t, ctx, s)
			given := caRow("agent", "a1", store.CAActive)
			given.CreatedAt, given.ActivatedAt = at(0), at(time.Minute)
			mustNil(t, "InsertCACert active", s.InsertCACert(ctx, given, link(record("ca.prepare"))))
			mustNil(t, "InsertCACert active, clock", s.InsertCACert(ctx, caRow("admin", "b1", store.CAActive), link(record("ca.prepare"))))
			mustNil(t, "InsertCACert prepared", s.InsertCACert(ctx, caRow("agent", "a2", store.CAPrepared), link(record("ca.prepare"))))
			rows, err = s.ListCACerts(ctx)
			mustNil(t, "ListCACerts", err)
			if len(rows) != 3 || rows[0].Serial != "b1" || rows[1].Serial != "a1" || rows[2].Serial != "a2" {
				t.Fatalf("ListCACerts order: %+v; want admin b1, then agent a1, a2", rows)
			}
			if diff := cmp.Diff(given, rows[1], cmpOpts...); diff != "" {
				t.Errorf("agent a1 (-inserted +listed):\n%s", diff)
			}
			if b := rows[0]; b.CreatedAt.Before(before) || b.ActivatedAt.Before(before) {
				t.Errorf("admin b1 created %v activated %v: want the store clock, at or after %v", b.CreatedAt, b.ActivatedAt, before)
			}
			if p := rows[2]; !p.ActivatedAt.IsZero() || p.CreatedAt.Before(before) {
				t.Errorf("prepared a2: activated %v created %v; want never activated, created by the store clock", p.ActivatedAt, p.CreatedAt)
			}
		}},
		{"one active and one prepared per role; serials unique", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("server", "s1", store.CAActive), link(record("ca.prepare"))))
			wantErr(t, "second active", s.InsertCACert(ctx, caRow("server", "s2", store.CAActive), link(record("ca.prepare"))), store.ErrConflict)
			mustNil(t, "prepared", s.InsertCACert(ctx, caRow("server", "s2", store.CAPrepared), link(record("ca.prepare"))))
			wantErr(t, "second prepared", s.InsertCACert(ctx, caRow("server", "s3", store.CAPrepared), link(record("ca.prepare"))), store.ErrConflict)
			wantErr(t, "duplicate serial", s.InsertCACert(ctx, caRow("agent", "s1", store.CAActive), link(record("ca.prepare"))), store.ErrConflict)
			mustNil(t, "another role", s.InsertCACert(ctx, caRow("agent", "g1", store.CAPrepared), link(record("ca.prepare"))))
			if err := s.InsertCACert(ctx, caRow("agent", "g9", store.CARetiring), link(record("ca.prepare"))); err == nil {
				t.Fatal("InsertCACert of a retiring certificate succeeded")
			}
			want := map[string]string{"s1": "active", "s2": "prepared", "g1": "prepared"}
			if got := caStates(t, ctx, s); !cmp.Equal(got, want) {
				t.Fatalf("states %v, want %v", got, want)
			}
		}},
		{"activate retires the active one; retire ends a retiring one", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("agent", "a1", store.CAActive), link(record("ca.prepare"))))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("agent", "a2", store.CAPrepared), link(record("ca.prepare"))))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("server", "s1", store.CAActive), link(record("ca.prepare"))))
			wantErr(t, "activate an active one", s.ActivateCACert(ctx, "agent", "a1", link(record("ca.activate"))), store.ErrConflict)
			wantErr(t, "activate under another role", s.ActivateCACert(ctx, "server", "a2", link(record("ca.activate"))), store.ErrConflict)
			wantErr(t, "activate an unknown one", s.ActivateCACert(ctx, "agent", "zz", link(record("ca.activate"))), store.ErrConflict)
			wantErr(t, "retire an active one", second(s.RetireCACert(ctx, "agent", "a1", link(record("ca.retire")))), store.ErrConflict)
			before := storeNow(t, ctx, s)
			mustNil(t, "ActivateCACert", s.ActivateCACert(ctx, "agent", "a2", link(record("ca.activate"))))
			want := map[string]string{"a1": "retiring", "a2": "active", "s1": "active"}
			if got := caStates(t, ctx, s); !cmp.Equal(got, want) {
				t.Fatalf("after activation: %v, want %v", got, want)
			}
			wantErr(t, "activate twice", s.ActivateCACert(ctx, "agent", "a2", link(record("ca.activate"))), store.ErrConflict)
			ref, err := s.RetireCACert(ctx, "agent", "a1", link(record("ca.retire")))
			mustNil(t, "RetireCACert", err)
			if string(ref) != "sealed-a1" {
				t.Errorf("RetireCACert returned the key reference %q, want its own, %q", ref, "sealed-a1")
			}
			ref, err = s.RetireCACert(ctx, "agent", "a1", link(record("ca.retire")))
			wantErr(t, "retire twice", err, store.ErrConflict)
			if ref != nil {
				t.Errorf("a retirement that conflicted returned the key reference %q", ref)
			}
			rows, err := s.ListCACerts(ctx)
			mustNil(t, "ListCACerts", err)
			for _, r := range rows {
				switch r.Serial {
				case "a1":
					if r.State != store.CARetired || r.RetiringAt.Before(before) || r.RetiredAt.Before(r.RetiringAt) {
						t.Errorf("a1: %+v; want retired, retiring then retired by the store clock", r)
					}
					if string(r.KeyRef) != "sealed-a1" {
						t.Errorf("retired a1 has the key reference %q; want sealed-a1 kept until its key is destroyed", r.KeyRef)
					}
				case "a2":
					if r.ActivatedAt.Before(before) {
						t.Errorf("a2 activated at %v, before %v", r.ActivatedAt, before)
					}
				}
			}
			// The key destroyed, its reference goes with its record, once.
			keyRefs := func() any {
				rows, err := s.ListCACerts(ctx)
				mustNil(t, "ListCACerts", err)
				m := map[string]string{}
				for _, r := range rows {
					m[r.Serial] = string(r.KeyRef)
				}
				return m
			}
			wantUnaudited(t, ctx, s, "ca.destroy_key", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.DropCAKey(ctx, "a1", []byte("sealed-a1"), audit)
			}, keyRefs)
			seq := auditSeq(t, ctx, s)
			wantErr(t, "DropCAKey of an active one", s.DropCAKey(ctx, "a2", []byte("sealed-a2"), link(record("ca.destroy_key"))), store.ErrConflict)
			wantErr(t, "DropCAKey of another reference", s.DropCAKey(ctx, "a1", []byte("sealed-a2"), link(record("ca.destroy_key"))), store.ErrConflict)
			mustNil(t, "DropCAKey", s.DropCAKey(ctx, "a1", []byte("sealed-a1"), link(record("ca.destroy_key"))))
			wantErr(t, "DropCAKey twice", s.DropCAKey(ctx, "a1", []byte("sealed-a1"), link(record("ca.destroy_key"))), store.ErrConflict)
			wantEqual[any](t, "key references after the drop", keyRefs(), map[string]string{"a1": "", "a2": "sealed-a2", "s1": "sealed-s1"})
			wantEqual(t, "audit records of the drops", auditSeq(t, ctx, s), seq+1)
		}},
		{"an unaudited CA write changes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("agent", "a1", store.CAActive), link(record("ca.import"))))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("agent", "a2", store.CAPrepared), link(record("ca.prepare"))))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("server", "s1", store.CAActive), link(record("ca.import"))))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("server", "s2", store.CAPrepared), link(record("ca.prepare"))))
			mustNil(t, "ActivateCACert", s.ActivateCACert(ctx, "server", "s2", link(record("ca.activate"))))
			mustNil(t, "PutRootRotation", s.PutRootRotation(ctx, store.RootRotation{}, store.RootRotation{Phase: store.RootPhaseInit}, true, link(record("ca.root_rotate"))))
			started, err := s.GetRootRotation(ctx)
			mustNil(t, "GetRootRotation", err)
			// Every row whole (key references included) and the rotation:
			// what an unaudited write must leave as it was.
			all := func() any {
				rows, err := s.ListCACerts(ctx)
				mustNil(t, "ListCACerts", err)
				rot, err := s.GetRootRotation(ctx)
				mustNil(t, "GetRootRotation", err)
				return fmt.Sprintf("%+v %d %s", rows, rot.Version, rot.Phase)
			}
			wantUnaudited(t, ctx, s, "ca.prepare", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.InsertCACert(ctx, caRow("admin", "m1", store.CAPrepared), audit)
			}, all)
			wantUnaudited(t, ctx, s, "ca.activate", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.ActivateCACert(ctx, "agent", "a2", audit)
			}, all)
			var refs [][]byte
			wantUnaudited(t, ctx, s, "ca.retire", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				ref, err := s.RetireCACert(ctx, "server", "s1", audit)
				refs = append(refs, ref)
				return err
			}, all)
			wantUnaudited(t, ctx, s, "ca.discard", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				ref, err := s.DiscardCACert(ctx, "agent", "a2", audit)
				refs = append(refs, ref)
				return err
			}, all)
			wantUnaudited(t, ctx, s, "ca.root_phase", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.PutRootRotation(ctx, started, store.RootRotation{Phase: store.RootPhaseUpdateAgents}, false, audit)
			}, all)
			for _, ref := range refs {
				if ref != nil {
					t.Errorf("an unaudited retirement or discard handed out the key reference %q: its key would be destroyed", ref)
				}
			}
			// Each, with its record, writes it.
			seq := auditSeq(t, ctx, s)
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("admin", "m1", store.CAPrepared), link(record("ca.prepare"))))
			ref, err := s.RetireCACert(ctx, "server", "s1", link(record("ca.retire")))
			mustNil(t, "RetireCACert", err)
			wantEqual(t, "retired key reference", string(ref), "sealed-s1")
			ref, err = s.DiscardCACert(ctx, "admin", "m1", link(record("ca.discard")))
			mustNil(t, "DiscardCACert", err)
			wantEqual(t, "discarded key reference", string(ref), "sealed-m1")
			mustNil(t, "ActivateCACert", s.ActivateCACert(ctx, "agent", "a2", link(record("ca.activate"))))
			mustNil(t, "PutRootRotation", s.PutRootRotation(ctx, started, store.RootRotation{Phase: store.RootPhaseUpdateAgents}, false, link(record("ca.root_phase"))))
			wantEqual(t, "states", caStates(t, ctx, s), map[string]string{"a1": store.CARetiring, "a2": store.CAActive, "s1": store.CARetired,
				"s2": store.CAActive, "m1": store.CARetired})
			if got := auditSeq(t, ctx, s); got != seq+5 {
				t.Fatalf("audit chain holds %d records after five CA writes; want %d", got, seq+5)
			}
		}},
		{"of concurrent retirements exactly one gets the key reference", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("agent", "a1", store.CAActive), link(record("ca.prepare"))))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("agent", "a2", store.CAPrepared), link(record("ca.prepare"))))
			mustNil(t, "ActivateCACert", s.ActivateCACert(ctx, "agent", "a2", link(record("ca.activate"))))
			const n = 6
			var wg sync.WaitGroup
			refs, errs := make(chan []byte, n), make(chan error, n)
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ref, err := s.RetireCACert(ctx, "agent", "a1", link(record("ca.retire")))
					if err != nil {
						errs <- err
						return
					}
					refs <- ref
				}()
			}
			wg.Wait()
			close(refs)
			close(errs)
			for err := range errs {
				wantErr(t, "concurrent retirement", err, store.ErrConflict)
			}
			var got [][]byte
			for r := range refs {
				got = append(got, r)
			}
			if len(got) != 1 || string(got[0]) != "sealed-a1" {
				t.Fatalf("concurrent retirements returned %q; want exactly one, the key reference sealed-a1", got)
			}
		}},
		{"a draft is claimed once; of concurrent claims exactly one gets it", func(t *testing.T, ctx context.Context, s store.Store) {
			before := storeNow(t, ctx, s)
			mustNil(t, "InsertCADraft", s.InsertCADraft(ctx, store.CADraft{Serial: "d1", Role: "agent", KeyRef: []byte("sealed-d1")}))
			mustNil(t, "InsertCADraft", s.InsertCADraft(ctx, store.CADraft{Serial: "d2", Role: "server", KeyRef: []byte("sealed-d2")}))
			wantErr(t, "duplicate draft", s.InsertCADraft(ctx, store.CADraft{Serial: "d1", Role: "agent", KeyRef: []byte("x")}), store.ErrConflict)
			drafts, err := s.ListCADrafts(ctx)
			mustNil(t, "ListCADrafts", err)
			if len(drafts) != 2 || drafts[0].Serial != "d1" || string(drafts[0].KeyRef) != "sealed-d1" || drafts[0].Role != "agent" || drafts[0].CreatedAt.Before(before) {
				t.Fatalf("ListCADrafts: %+v; want d1 (agent, sealed-d1, created by the store clock) then d2", drafts)
			}
			draftsNow := func() any { d, err := s.ListCADrafts(ctx); return fmt.Sprint(d, err) }
			wantUnaudited(t, ctx, s, "ca.discard", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.ClaimCADraft(ctx, "d1", audit)
				return err
			}, draftsNow)
			seq := auditSeq(t, ctx, s)
			const n = 6
			var wg sync.WaitGroup
			got, errs := make(chan store.CADraft, n), make(chan error, n)
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, err := s.ClaimCADraft(ctx, "d1", link(record("ca.discard")))
					if err != nil {
						errs <- err
						return
					}
					got <- d
				}()
			}
			wg.Wait()
			close(got)
			close(errs)
			for err := range errs {
				wantErr(t, "concurrent claim", err, store.ErrNotFound)
			}
			var claimed []store.CADraft
			for d := range got {
				claimed = append(claimed, d)
			}
			if len(claimed) != 1 || string(claimed[0].KeyRef) != "sealed-d1" {
				t.Fatalf("concurrent claims got %+v; want exactly one, with its key reference", claimed)
			}
			drafts, err = s.ListCADrafts(ctx)
			mustNil(t, "ListCADrafts", err)
			if len(drafts) != 1 || drafts[0].Serial != "d2" {
				t.Fatalf("after the claim: %+v; want d2 alone", drafts)
			}
			wantEqual(t, "audit records after concurrent claims", auditSeq(t, ctx, s), seq+1)
		}},
		{"a draft becomes its prepared intermediate in one audited write, unless claimed first", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertCADraft", s.InsertCADraft(ctx, store.CADraft{Serial: "d1", Role: "agent", KeyRef: []byte("sealed-d1")}))
			mustNil(t, "InsertCADraft", s.InsertCADraft(ctx, store.CADraft{Serial: "d2", Role: "agent", KeyRef: []byte("sealed-d2")}))
			row := func(serial string) store.CACert {
				c := caRow("agent", serial, store.CAPrepared)
				c.KeyRef = []byte("sealed-" + serial)
				return c
			}
			all := func() any {
				d, derr := s.ListCADrafts(ctx)
				c, cerr := s.ListCACerts(ctx)
				return fmt.Sprint(d, derr, c, cerr)
			}
			wantUnaudited(t, ctx, s, "ca.prepare", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.PrepareFromCADraft(ctx, row("d1"), audit)
			}, all)
			before, seq := all(), auditSeq(t, ctx, s)
			other := row("d1")
			other.KeyRef = []byte("another key")
			wantErr(t, "a draft's serial with another key", s.PrepareFromCADraft(ctx, other, link(record("ca.prepare"))), store.ErrNotFound)
			other = row("d1")
			other.Role = "server"
			wantErr(t, "a draft's serial under another role", s.PrepareFromCADraft(ctx, other, link(record("ca.prepare"))), store.ErrNotFound)
			wantErr(t, "no draft", s.PrepareFromCADraft(ctx, row("d3"), link(record("ca.prepare"))), store.ErrNotFound)
			wantEqual(t, "after the refusals", all(), before)
			wantEqual(t, "audit records after the refusals", auditSeq(t, ctx, s), seq)
			mustNil(t, "PrepareFromCADraft", s.PrepareFromCADraft(ctx, row("d1"), link(record("ca.prepare"))))
			wantEqual(t, "audit records after the prepare", auditSeq(t, ctx, s), seq+1)
			drafts, err := s.ListCADrafts(ctx)
			mustNil(t, "ListCADrafts", err)
			if len(drafts) != 1 || drafts[0].Serial != "d2" {
				t.Fatalf("drafts after d1 was prepared: %+v; want d2 alone", drafts)
			}
			wantEqual(t, "states", caStates(t, ctx, s), map[string]string{"d1": store.CAPrepared})
			// A second prepared one conflicts, and its draft keeps its key.
			wantErr(t, "a second prepared", s.PrepareFromCADraft(ctx, row("d2"), link(record("ca.prepare"))), store.ErrConflict)
			if drafts, _ := s.ListCADrafts(ctx); len(drafts) != 1 || drafts[0].Serial != "d2" {
				t.Fatalf("a refused prepare took its draft: %+v", drafts)
			}
			// Claimed (the sweep, another replica) first, it is not prepared.
			_, err = s.ClaimCADraft(ctx, "d2", link(record("ca.discard")))
			mustNil(t, "ClaimCADraft", err)
			mustNil(t, "DiscardCACert", second(s.DiscardCACert(ctx, "agent", "d1", link(record("ca.discard")))))
			wantErr(t, "prepare after the claim", s.PrepareFromCADraft(ctx, row("d2"), link(record("ca.prepare"))), store.ErrNotFound)
			wantEqual(t, "states", caStates(t, ctx, s), map[string]string{"d1": store.CARetired})
		}},
		{"of prepares, claims and key drops racing for one key exactly one takes it, with one record", func(t *testing.T, ctx context.Context, s store.Store) {
			// A draft's key goes to the intermediate prepared from it or
			// to the sweep that claims it, never to both; a retired key's
			// reference is emptied once, by one replica.
			mustNil(t, "InsertCADraft", s.InsertCADraft(ctx, store.CADraft{Serial: "d1", Role: "agent", KeyRef: []byte("sealed-d1")}))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("server", "s1", store.CAPrepared), link(record("ca.prepare"))))
			_, err := s.DiscardCACert(ctx, "server", "s1", link(record("ca.discard")))
			mustNil(t, "DiscardCACert", err)
			seq := auditSeq(t, ctx, s)
			prepared := caRow("agent", "d1", store.CAPrepared)
			prepared.KeyRef = []byte("sealed-d1")
			const n = 4
			var (
				wg                      sync.WaitGroup
				mu                      sync.Mutex
				prepares, claims, drops int
			)
			count := func(what string, into *int, err error, lost error) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					*into++
				case !errors.Is(err, lost):
					t.Errorf("%s: %v, want nil or %v", what, err, lost)
				}
			}
			for range n {
				wg.Go(func() {
					count("PrepareFromCADraft", &prepares, s.PrepareFromCADraft(ctx, prepared, link(record("ca.prepare"))), store.ErrNotFound)
				})
				wg.Go(func() {
					_, err := s.ClaimCADraft(ctx, "d1", link(record("ca.discard")))
					count("ClaimCADraft", &claims, err, store.ErrNotFound)
				})
				wg.Go(func() {
					count("DropCAKey", &drops, s.DropCAKey(ctx, "s1", []byte("sealed-s1"), link(record("ca.destroy_key"))), store.ErrConflict)
				})
			}
			wg.Wait()
			if prepares+claims != 1 || drops != 1 {
				t.Fatalf("%d prepares, %d claims and %d key drops won; want one prepare or one claim, and one drop", prepares, claims, drops)
			}
			wantEqual(t, "audit records after the race", auditSeq(t, ctx, s), seq+2)
			drafts, err := s.ListCADrafts(ctx)
			mustNil(t, "ListCADrafts", err)
			want := map[string]string{"s1": store.CARetired}
			if prepares == 1 {
				want["d1"] = store.CAPrepared
			}
			if len(drafts) != 0 {
				t.Fatalf("drafts after the race: %+v; want none", drafts)
			}
			wantEqual(t, "states after the race", caStates(t, ctx, s), want)
		}},
		{"of concurrent activations and imports exactly one succeeds", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("agent", "a1", store.CAActive), link(record("ca.prepare"))))
			mustNil(t, "InsertCACert", s.InsertCACert(ctx, caRow("agent", "a2", store.CAPrepared), link(record("ca.prepare"))))
			const n = 6
			var wg sync.WaitGroup
			errs := make(chan error, 2*n)
			for i := range n {
				wg.Add(2)
				go func() { defer wg.Done(); errs <- s.ActivateCACert(ctx, "agent", "a2", link(record("ca.activate"))) }()
				go func() {
					defer wg.Done()
					errs <- s.InsertCACert(ctx, caRow("admin", fmt.Sprintf("m%d", i), store.CAActive), link(record("ca.prepare")))
				}()
			}
			wg.Wait()
			close(errs)
			ok := 0
			for err := range errs {
				switch {
				case err == nil:
					ok++
				default:
					wantErr(t, "concurrent step", err, store.ErrConflict)
				}
			}
			if ok != 2 {
				t.Fatalf("%d of the concurrent steps succeeded, want one activation and one import", ok)
			}
			active := 0
			for _, st := range caStates(t, ctx, s) {
				if st == store.CAActive {
					active++
				}
			}
			if active != 2 {
				t.Fatalf("%d active certificates, want one agent and one admin", active)
			}
		}},
	}
}
