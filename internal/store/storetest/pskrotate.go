package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// byStatus indexes ListPSKs by status; it fails if a live status (active,
// grace) appears twice.
func byStatus(t *testing.T, ctx context.Context, s store.Store) (map[string][]store.PSK, []store.PSK) {
	t.Helper()
	ps, err := s.ListPSKs(ctx)
	mustNil(t, "ListPSKs", err)
	m := map[string][]store.PSK{}
	for _, p := range ps {
		m[p.Status] = append(m[p.Status], p)
	}
	if len(m[store.PSKActive]) > 1 || len(m[store.PSKGrace]) > 1 {
		t.Fatalf("ListPSKs has %d active and %d grace PSKs, want at most one of each: %v",
			len(m[store.PSKActive]), len(m[store.PSKGrace]), ps)
	}
	return m, ps
}

// within fails unless got lies in [lo, hi] (times as the store keeps them).
func within(t *testing.T, what string, got, lo, hi time.Time) {
	t.Helper()
	lo, hi = lo.Truncate(time.Millisecond), hi.Add(time.Millisecond)
	if got.Before(lo) || got.After(hi) {
		t.Errorf("%s = %v, want within [%v, %v]", what, got, lo, hi)
	}
}

// newPSK is a PSK for RotatePSK: only its ID, ciphertext, nonce and creation
// time count.
func newPSK(id string, age time.Duration) store.PSK {
	return store.PSK{ID: id, Ciphertext: []byte("ciphertext-" + id), Nonce: []byte("nonce-" + id), CreatedAt: at(-age)}
}

func pskRotateCases() []testCase {
	return []testCase{
		{"rotate moves active to grace and inserts the new active", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("a", store.PSKActive, time.Hour), link(record("psk.create"))))
			before, err := s.Now(ctx)
			mustNil(t, "Now", err)
			old, err := s.RotatePSK(ctx, "a", newPSK("b", 0), 24*time.Hour, link(record("psk.rotate")))
			mustNil(t, "RotatePSK", err)
			after, err := s.Now(ctx)
			mustNil(t, "Now", err)

			if old.ID != "a" || old.Status != store.PSKGrace || !old.RevokedAt.IsZero() {
				t.Errorf("RotatePSK returned %+v, want a in grace", old)
			}
			within(t, "grace expiry", old.GraceExpiresAt, before.Add(24*time.Hour), after.Add(24*time.Hour))
			m, ps := byStatus(t, ctx, s)
			want := psk("a", store.PSKGrace, time.Hour)
			want.GraceExpiresAt = old.GraceExpiresAt
			wantEqual(t, "ListPSKs", ps, []store.PSK{
				{ID: "b", Ciphertext: []byte("ciphertext-b"), Nonce: []byte("nonce-b"), Status: store.PSKActive, CreatedAt: at(0)},
				want,
			})
			if len(m[store.PSKActive]) != 1 || m[store.PSKActive][0].ID != "b" {
				t.Errorf("active PSKs = %v, want b", m[store.PSKActive])
			}
		}},
		{"second rotate revokes the old grace PSK", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("a", store.PSKActive, 2*time.Hour), link(record("psk.create"))))
			_, err := s.RotatePSK(ctx, "a", newPSK("b", time.Hour), time.Hour, link(record("psk.rotate")))
			mustNil(t, "RotatePSK a→b", err)
			before, err := s.Now(ctx)
			mustNil(t, "Now", err)
			old, err := s.RotatePSK(ctx, "b", newPSK("c", 0), time.Hour, link(record("psk.rotate")))
			mustNil(t, "RotatePSK b→c", err)
			after, err := s.Now(ctx)
			mustNil(t, "Now", err)
			if old.ID != "b" || old.Status != store.PSKGrace {
				t.Errorf("RotatePSK returned %+v, want b in grace", old)
			}
			m, ps := byStatus(t, ctx, s)
			if got := ids(ps); fmt.Sprint(got) != "[c b a]" {
				t.Errorf("ListPSKs IDs = %v, want [c b a] (newest first)", got)
			}
			if len(m[store.PSKRevoked]) != 1 || m[store.PSKRevoked][0].ID != "a" {
				t.Fatalf("revoked = %v, want a", m[store.PSKRevoked])
			}
			a := m[store.PSKRevoked][0]
			within(t, "a revoked at", a.RevokedAt, before, after)
			if !a.GraceExpiresAt.IsZero() {
				t.Errorf("revoked a keeps GraceExpiresAt %v, want the zero time", a.GraceExpiresAt)
			}
			if m[store.PSKGrace][0].ID != "b" || m[store.PSKActive][0].ID != "c" {
				t.Errorf("grace %v active %v, want b and c", m[store.PSKGrace], m[store.PSKActive])
			}
		}},
		{"grace zero revokes at once", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("a", store.PSKActive, 2*time.Hour), link(record("psk.create"))))
			_, err := s.RotatePSK(ctx, "a", newPSK("b", time.Hour), time.Hour, link(record("psk.rotate")))
			mustNil(t, "RotatePSK a→b", err)
			before, err := s.Now(ctx)
			mustNil(t, "Now", err)
			old, err := s.RotatePSK(ctx, "b", newPSK("c", 0), 0, link(record("psk.rotate")))
			mustNil(t, "RotatePSK b→c", err)
			after, err := s.Now(ctx)
			mustNil(t, "Now", err)
			if old.ID != "b" || old.Status != store.PSKRevoked || !old.GraceExpiresAt.IsZero() {
				t.Errorf("RotatePSK returned %+v, want b revoked with no grace expiry", old)
			}
			within(t, "b revoked at", old.RevokedAt, before, after)
			m, _ := byStatus(t, ctx, s)
			if len(m[store.PSKGrace]) != 0 || len(m[store.PSKRevoked]) != 2 || m[store.PSKActive][0].ID != "c" {
				t.Errorf("after rotate --grace 0: %v, want c active, a and b revoked, no grace", m)
			}
		}},
		{"rotate from a PSK that is not active conflicts", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("a", store.PSKActive, 2*time.Hour), link(record("psk.create"))))
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("g", store.PSKGrace, 3*time.Hour), link(record("psk.create"))))
			_, before := byStatus(t, ctx, s)
			for _, from := range []string{"g", "missing", ""} {
				_, err := s.RotatePSK(ctx, from, newPSK("b", 0), time.Hour, link(record("psk.rotate")))
				wantErr(t, "RotatePSK from "+from, err, store.ErrConflict)
			}
			_, err := s.RotatePSK(ctx, "a", newPSK("g", 0), time.Hour, link(record("psk.rotate")))
			wantErr(t, "RotatePSK to an existing ID", err, store.ErrConflict)
			_, after := byStatus(t, ctx, s)
			wantEqual(t, "ListPSKs after refused rotations", after, before)
		}},
		{"concurrent rotations: exactly one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("a", store.PSKActive, time.Hour), link(record("psk.create"))))
			const n = 8
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					_, errs[i] = s.RotatePSK(ctx, "a", newPSK(fmt.Sprintf("n%d", i), 0), time.Hour, link(record("psk.rotate")))
				})
			}
			wg.Wait()
			winner := ""
			for i, err := range errs {
				switch {
				case err == nil && winner == "":
					winner = fmt.Sprintf("n%d", i)
				case err == nil:
					t.Errorf("rotations %s and n%d both succeeded", winner, i)
				case !errors.Is(err, store.ErrConflict):
					t.Errorf("rotation n%d: %v, want ErrConflict", i, err)
				}
			}
			if winner == "" {
				t.Fatal("no rotation succeeded")
			}
			m, ps := byStatus(t, ctx, s)
			if len(ps) != 2 || m[store.PSKActive][0].ID != winner || m[store.PSKGrace][0].ID != "a" {
				t.Errorf("ListPSKs = %v, want %s active and a in grace, nothing else", ids(ps), winner)
			}
		}},
		{"an unaudited rotation or expiry changes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, store.PSK{ID: "g", Ciphertext: []byte{1}, Nonce: []byte{2},
				Status: store.PSKGrace, CreatedAt: now.Add(-time.Hour), GraceExpiresAt: now.Add(-time.Minute)}, link(record("psk.create"))))
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("a", store.PSKActive, time.Hour), link(record("psk.create"))))
			all := func() any { _, ps := byStatus(t, ctx, s); return ps }
			wantUnaudited(t, ctx, s, "psk.rotate", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.RotatePSK(ctx, "a", newPSK("b", 0), time.Hour, audit)
				return err
			}, all)
			var named []string
			wantUnaudited(t, ctx, s, "psk.expire", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				swept, err := s.RevokeExpiredGracePSKs(ctx, func(ids []string) func(store.AuditHead) (store.AuditRecord, error) {
					named = ids
					return audit
				})
				if err == nil && len(swept) == 0 {
					return errors.New("nothing swept")
				}
				return err
			}, all)
			// The build that failed was asked for the record of g.
			wantEqual(t, "IDs the unaudited expiry's record was built for", named, []string{"g"})
			seq := auditSeq(t, ctx, s)
			swept, err := s.RevokeExpiredGracePSKs(ctx, expireLink)
			mustNil(t, "RevokeExpiredGracePSKs with its record", err)
			wantEqual(t, "swept", swept, []string{"g"})
			// Nothing more to sweep: no record.
			swept, err = s.RevokeExpiredGracePSKs(ctx, func([]string) func(store.AuditHead) (store.AuditRecord, error) {
				t.Error("RevokeExpiredGracePSKs asked for a record with nothing to revoke")
				return link(record("psk.expire"))
			})
			mustNil(t, "RevokeExpiredGracePSKs with nothing to revoke", err)
			wantEqual(t, "swept", len(swept), 0)
			_, err = s.RotatePSK(ctx, "a", newPSK("b", 0), time.Hour, link(record("psk.rotate")))
			mustNil(t, "RotatePSK with its record", err)
			if got := auditSeq(t, ctx, s); got != seq+2 {
				t.Fatalf("audit chain holds %d records after an expiry, an empty sweep and a rotation; want %d", got, seq+2)
			}
		}},
		{"revoke expired grace PSKs by the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			now, err := s.Now(ctx)
			mustNil(t, "Now", err)
			swept, err := s.RevokeExpiredGracePSKs(ctx, expireLink)
			mustNil(t, "RevokeExpiredGracePSKs on an empty store", err)
			if len(swept) != 0 {
				t.Errorf("RevokeExpiredGracePSKs on an empty store = %v, want none", swept)
			}
			// Stored times are relative to the store clock, not base: "a"
			// ended a minute ago by it, "g" ends in an hour.
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, store.PSK{ID: "a", Ciphertext: []byte{1}, Nonce: []byte{2},
				Status: store.PSKGrace, CreatedAt: now.Add(-time.Hour), GraceExpiresAt: now.Add(-time.Minute)}, link(record("psk.create"))))
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("b", store.PSKActive, 0), link(record("psk.create"))))
			swept, err = s.RevokeExpiredGracePSKs(ctx, expireLink)
			mustNil(t, "RevokeExpiredGracePSKs", err)
			after, err := s.Now(ctx)
			mustNil(t, "Now", err)
			if fmt.Sprint(swept) != "[a]" {
				t.Errorf("RevokeExpiredGracePSKs = %v, want [a]", swept)
			}
			m, _ := byStatus(t, ctx, s)
			if len(m[store.PSKRevoked]) != 1 {
				t.Fatalf("revoked = %v, want a", m[store.PSKRevoked])
			}
			within(t, "a revoked at", m[store.PSKRevoked][0].RevokedAt, now, after)

			// A grace that has not ended stays, and a second sweep finds
			// nothing more.
			_, err = s.RotatePSK(ctx, "b", newPSK("c", 0), time.Hour, link(record("psk.rotate")))
			mustNil(t, "RotatePSK", err)
			swept, err = s.RevokeExpiredGracePSKs(ctx, expireLink)
			mustNil(t, "RevokeExpiredGracePSKs", err)
			if len(swept) != 0 {
				t.Errorf("RevokeExpiredGracePSKs with b's grace an hour away = %v, want none", swept)
			}
			m, _ = byStatus(t, ctx, s)
			if len(m[store.PSKGrace]) != 1 || m[store.PSKGrace][0].ID != "b" {
				t.Errorf("grace = %v, want b", m[store.PSKGrace])
			}
		}},
		{"rotate defaults the creation time to the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertPSK", s.InsertPSK(ctx, psk("a", store.PSKActive, time.Hour), link(record("psk.create"))))
			before, err := s.Now(ctx)
			mustNil(t, "Now", err)
			p := newPSK("b", 0)
			p.CreatedAt = time.Time{}
			_, err = s.RotatePSK(ctx, "a", p, time.Hour, link(record("psk.rotate")))
			mustNil(t, "RotatePSK", err)
			after, err := s.Now(ctx)
			mustNil(t, "Now", err)
			m, ps := byStatus(t, ctx, s)
			within(t, "b created at", m[store.PSKActive][0].CreatedAt, before, after)
			if fmt.Sprint(ids(ps)) != "[b a]" {
				t.Errorf("ListPSKs IDs = %v, want [b a] (newest first)", ids(ps))
			}
		}},
	}
}

func ids(ps []store.PSK) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.ID)
	}
	return out
}
