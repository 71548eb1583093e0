package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// psk returns a PSK with the given ID and status, created age before base,
// with the time fields its status implies.
func psk(id, status string, age time.Duration) store.PSK {
	p := store.PSK{
		ID:         id,
		Ciphertext: []byte("ciphertext-" + id),
		Nonce:      []byte("nonce-" + id),
		Status:     status,
		CreatedAt:  at(-age),
	}
	switch status {
	case store.PSKGrace:
		p.GraceExpiresAt = at(24 * time.Hour)
	case store.PSKRevoked:
		p.RevokedAt = at(-age + time.Hour)
	}
	return p
}

// newestFirst is the order ListPSKs promises.
func newestFirst(ps []store.PSK) []store.PSK {
	ps = slices.Clone(ps)
	slices.SortStableFunc(ps, func(a, b store.PSK) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return ps
}

func pskCases() []testCase {
	// Each invariant case inserts existing (which must succeed), then
	// insert, and checks the error and that the table holds exactly what
	// the error implies.
	invariants := []struct {
		name     string
		existing []store.PSK
		insert   store.PSK
		want     error
	}{
		{
			name:   "first active",
			insert: psk("a", store.PSKActive, 0),
		},
		{
			name:     "second active conflicts",
			existing: []store.PSK{psk("a", store.PSKActive, time.Hour)},
			insert:   psk("b", store.PSKActive, 0),
			want:     store.ErrConflict,
		},
		{
			name:     "second grace conflicts",
			existing: []store.PSK{psk("a", store.PSKGrace, time.Hour)},
			insert:   psk("b", store.PSKGrace, 0),
			want:     store.ErrConflict,
		},
		{
			name:     "active beside grace",
			existing: []store.PSK{psk("a", store.PSKGrace, time.Hour)},
			insert:   psk("b", store.PSKActive, 0),
		},
		{
			name:     "grace beside active",
			existing: []store.PSK{psk("a", store.PSKActive, time.Hour)},
			insert:   psk("b", store.PSKGrace, 0),
		},
		{
			name: "many revoked",
			existing: []store.PSK{
				psk("a", store.PSKActive, 5*time.Hour),
				psk("b", store.PSKGrace, 4*time.Hour),
				psk("c", store.PSKRevoked, 3*time.Hour),
				psk("d", store.PSKRevoked, 2*time.Hour),
			},
			insert: psk("e", store.PSKRevoked, time.Hour),
		},
		{
			name:     "duplicate id conflicts",
			existing: []store.PSK{psk("a", store.PSKRevoked, time.Hour)},
			insert:   psk("a", store.PSKActive, 0),
			want:     store.ErrConflict,
		},
		{
			name: "second active conflicts among revoked",
			existing: []store.PSK{
				psk("a", store.PSKRevoked, 3*time.Hour),
				psk("b", store.PSKActive, 2*time.Hour),
				psk("c", store.PSKRevoked, time.Hour),
			},
			insert: psk("d", store.PSKActive, 0),
			want:   store.ErrConflict,
		},
	}

	var cases []testCase
	for _, tc := range invariants {
		cases = append(cases, testCase{tc.name, func(t *testing.T, ctx context.Context, s store.Store) {
			for _, p := range tc.existing {
				mustNil(t, "InsertPSK "+p.ID, s.InsertPSK(ctx, p, link(record("psk.create"))))
			}
			err := s.InsertPSK(ctx, tc.insert, link(record("psk.create")))
			wantErr(t, "InsertPSK "+tc.insert.ID, err, tc.want)
			want := tc.existing
			if tc.want == nil {
				want = append(slices.Clone(want), tc.insert)
			}
			got, err := s.ListPSKs(ctx)
			mustNil(t, "ListPSKs", err)
			wantEqual(t, "ListPSKs", got, newestFirst(want))
		}})
	}

	return append(cases,
		testCase{"empty list", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.ListPSKs(ctx)
			mustNil(t, "ListPSKs", err)
			if len(got) != 0 {
				t.Errorf("ListPSKs on an empty store = %v, want none", got)
			}
		}},
		testCase{"list newest first with every field", func(t *testing.T, ctx context.Context, s store.Store) {
			ps := []store.PSK{
				// Inserted out of order; zero and set times both round-trip,
				// as do binary ciphertexts.
				{ID: "mid", Ciphertext: []byte{0, 1, 2, 0xff}, Nonce: []byte{9, 8, 7}, Status: store.PSKGrace,
					CreatedAt: at(-2 * time.Hour), GraceExpiresAt: at(time.Hour)},
				{ID: "new", Ciphertext: []byte{0xde, 0xad}, Nonce: []byte{0xbe, 0xef}, Status: store.PSKActive,
					CreatedAt: at(-time.Hour)},
				{ID: "old", Ciphertext: []byte{0}, Nonce: []byte{1}, Status: store.PSKRevoked,
					CreatedAt: at(-3 * time.Hour), RevokedAt: at(-150 * time.Minute)},
			}
			for _, p := range ps {
				mustNil(t, "InsertPSK "+p.ID, s.InsertPSK(ctx, p, link(record("psk.create"))))
			}
			got, err := s.ListPSKs(ctx)
			mustNil(t, "ListPSKs", err)
			wantEqual(t, "ListPSKs", got, []store.PSK{ps[1], ps[0], ps[2]})
			for _, p := range got {
				if p.Status != store.PSKGrace && !p.GraceExpiresAt.IsZero() {
					t.Errorf("PSK %s: GraceExpiresAt = %v, want the zero time", p.ID, p.GraceExpiresAt)
				}
				if p.Status != store.PSKRevoked && !p.RevokedAt.IsZero() {
					t.Errorf("PSK %s: RevokedAt = %v, want the zero time", p.ID, p.RevokedAt)
				}
			}
		}},
		testCase{"an unaudited PSK is not created", func(t *testing.T, ctx context.Context, s store.Store) {
			all := func() any { ps, err := s.ListPSKs(ctx); mustNil(t, "ListPSKs", err); return ps }
			wantUnaudited(t, ctx, s, "psk.create", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.InsertPSK(ctx, psk("a", store.PSKActive, 0), audit)
			}, all)
			seq := auditSeq(t, ctx, s)
			mustNil(t, "InsertPSK with its record", s.InsertPSK(ctx, psk("a", store.PSKActive, 0), link(record("psk.create"))))
			if got := auditSeq(t, ctx, s); got != seq+1 {
				t.Fatalf("audit chain holds %d records after a PSK's creation; want %d", got, seq+1)
			}
		}},
		testCase{"unknown status is rejected", func(t *testing.T, ctx context.Context, s store.Store) {
			if err := s.InsertPSK(ctx, psk("a", "bogus", 0), link(record("psk.create"))); err == nil {
				t.Fatal("InsertPSK with status \"bogus\" succeeded, want an error")
			}
			got, err := s.ListPSKs(ctx)
			mustNil(t, "ListPSKs", err)
			if len(got) != 0 {
				t.Errorf("ListPSKs = %v, want none", got)
			}
		}},
	)
}
