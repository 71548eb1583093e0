package storetest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// ticketKey is a ticket key for RotateTicketKey, created age before base:
// only its ID, keys, nonce and creation time count.
func ticketKey(id string, age time.Duration) store.TicketKey {
	pub := sha256.Sum256([]byte("public " + id))
	return store.TicketKey{
		ID: id, PublicKey: pub[:], Ciphertext: []byte("sealed-" + id), Nonce: []byte("nonce-" + id),
		CreatedAt: at(-age),
	}
}

// active is k as RotateTicketKey stores it.
func active(k store.TicketKey) store.TicketKey {
	k.Status, k.RetiredAt, k.PublishUntil = store.TicketKeyActive, time.Time{}, time.Time{}
	return k
}

// retired is k retired at retiredAt, published for overlap more.
func retired(k store.TicketKey, retiredAt time.Time, overlap time.Duration) store.TicketKey {
	k.Status, k.RetiredAt, k.PublishUntil = store.TicketKeyRetired, retiredAt, retiredAt.Add(overlap)
	return k
}

func mustRotateKey(t *testing.T, ctx context.Context, s store.Store, from string, k store.TicketKey, overlap time.Duration) {
	t.Helper()
	mustNil(t, fmt.Sprintf("RotateTicketKey %q→%s", from, k.ID), s.RotateTicketKey(ctx, from, k, overlap))
}

func listKeys(t *testing.T, ctx context.Context, s store.Store) []store.TicketKey {
	t.Helper()
	ks, err := s.ListTicketKeys(ctx)
	mustNil(t, "ListTicketKeys", err)
	n := 0
	for _, k := range ks {
		if k.Status == store.TicketKeyActive {
			n++
		}
	}
	if n > 1 {
		t.Fatalf("ListTicketKeys has %d active keys, want at most one: %v", n, ks)
	}
	return ks
}

func keyIDs(ks []store.TicketKey) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.ID)
	}
	return out
}

func ticketKeyCases() []testCase {
	cases := []testCase{
		{"no keys", func(t *testing.T, ctx context.Context, s store.Store) {
			if ks := listKeys(t, ctx, s); len(ks) != 0 {
				t.Errorf("ListTicketKeys on an empty store = %v", ks)
			}
			ids, err := s.DeleteRetiredTicketKeys(ctx)
			mustNil(t, "DeleteRetiredTicketKeys", err)
			if len(ids) != 0 {
				t.Errorf("DeleteRetiredTicketKeys on an empty store = %v", ids)
			}
		}},
		{"first key from none", func(t *testing.T, ctx context.Context, s store.Store) {
			k := ticketKey("k1", time.Hour)
			k.Status, k.RetiredAt = store.TicketKeyRetired, at(0) // ignored
			mustRotateKey(t, ctx, s, "", k, time.Hour)
			wantEqual(t, "ListTicketKeys", listKeys(t, ctx, s), []store.TicketKey{active(k)})
			// Another first key finds k1 active.
			err := s.RotateTicketKey(ctx, "", ticketKey("k2", 0), time.Hour)
			wantErr(t, "second RotateTicketKey from none", err, store.ErrConflict)
			wantEqual(t, "ListTicketKeys", listKeys(t, ctx, s), []store.TicketKey{active(k)})
		}},
		{"rotate retires the active key, published for the overlap", func(t *testing.T, ctx context.Context, s store.Store) {
			k1, k2 := ticketKey("k1", time.Hour), ticketKey("k2", 0)
			mustRotateKey(t, ctx, s, "", k1, time.Hour)
			before := storeNow(t, ctx, s)
			mustRotateKey(t, ctx, s, "k1", k2, 24*time.Hour)
			after := storeNow(t, ctx, s)
			ks := listKeys(t, ctx, s)
			if len(ks) != 2 {
				t.Fatalf("ListTicketKeys = %v, want k2 and k1", keyIDs(ks))
			}
			within(t, "k1 RetiredAt", ks[1].RetiredAt, before, after)
			wantEqual(t, "ListTicketKeys", ks, []store.TicketKey{active(k2), retired(k1, ks[1].RetiredAt, 24*time.Hour)})
		}},
		{"a zero creation time becomes the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			mustRotateKey(t, ctx, s, "", ticketKey("k1", time.Hour), time.Hour)
			k := ticketKey("k2", 0)
			k.CreatedAt = time.Time{}
			before := storeNow(t, ctx, s)
			mustRotateKey(t, ctx, s, "k1", k, time.Hour)
			after := storeNow(t, ctx, s)
			ks := listKeys(t, ctx, s)
			if fmt.Sprint(keyIDs(ks)) != "[k2 k1]" {
				t.Fatalf("ListTicketKeys IDs = %v, want [k2 k1] (newest first)", keyIDs(ks))
			}
			within(t, "k2 CreatedAt", ks[0].CreatedAt, before, after)
			if !ks[0].CreatedAt.Equal(ks[1].RetiredAt) {
				t.Errorf("k2 created at %v, k1 retired at %v: want one reading of the clock", ks[0].CreatedAt, ks[1].RetiredAt)
			}
		}},
		{"overlap of zero or less ends publication at once", func(t *testing.T, ctx context.Context, s store.Store) {
			mustRotateKey(t, ctx, s, "", ticketKey("k1", 3*time.Hour), time.Hour)
			mustRotateKey(t, ctx, s, "k1", ticketKey("k2", 2*time.Hour), 0)
			mustRotateKey(t, ctx, s, "k2", ticketKey("k3", time.Hour), -time.Hour)
			for _, k := range listKeys(t, ctx, s)[1:] {
				if k.RetiredAt.IsZero() || !k.PublishUntil.Equal(k.RetiredAt) {
					t.Errorf("%s: retired at %v, published until %v; want the same instant", k.ID, k.RetiredAt, k.PublishUntil)
				}
			}
		}},
		{"delete retired keys by the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			k1, k2, k3, k4 := ticketKey("k1", 4*time.Hour), ticketKey("k2", 3*time.Hour), ticketKey("k3", 2*time.Hour), ticketKey("k4", time.Hour)
			mustRotateKey(t, ctx, s, "", k1, time.Hour)
			mustRotateKey(t, ctx, s, "k1", k2, time.Hour)  // k1 published for an hour more
			mustRotateKey(t, ctx, s, "k2", k3, 0)          // k2 no more
			mustRotateKey(t, ctx, s, "k3", k4, -time.Hour) // k3 no more
			before := listKeys(t, ctx, s)
			ids, err := s.DeleteRetiredTicketKeys(ctx)
			mustNil(t, "DeleteRetiredTicketKeys", err)
			if fmt.Sprint(ids) != "[k2 k3]" {
				t.Errorf("DeleteRetiredTicketKeys = %v, want [k2 k3]", ids)
			}
			wantEqual(t, "ListTicketKeys after the sweep", listKeys(t, ctx, s), []store.TicketKey{before[0], before[3]})
			ids, err = s.DeleteRetiredTicketKeys(ctx)
			mustNil(t, "DeleteRetiredTicketKeys again", err)
			if len(ids) != 0 {
				t.Errorf("second DeleteRetiredTicketKeys = %v, want none", ids)
			}
		}},
		{"rotate from a key that is not active conflicts", func(t *testing.T, ctx context.Context, s store.Store) {
			mustRotateKey(t, ctx, s, "", ticketKey("k1", 2*time.Hour), time.Hour)
			mustRotateKey(t, ctx, s, "k1", ticketKey("k2", time.Hour), time.Hour)
			before := listKeys(t, ctx, s)
			for _, from := range []string{"k1", "missing", ""} {
				err := s.RotateTicketKey(ctx, from, ticketKey("k3", 0), time.Hour)
				wantErr(t, fmt.Sprintf("RotateTicketKey from %q", from), err, store.ErrConflict)
			}
			for _, id := range []string{"k1", "k2"} {
				err := s.RotateTicketKey(ctx, "k2", ticketKey(id, 0), time.Hour)
				wantErr(t, "RotateTicketKey to the existing "+id, err, store.ErrConflict)
			}
			wantEqual(t, "ListTicketKeys after refused rotations", listKeys(t, ctx, s), before)
		}},
		{"concurrent first keys: exactly one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 8
			errs := concurrently(n, func(i int) error {
				return s.RotateTicketKey(ctx, "", ticketKey(fmt.Sprintf("n%d", i), 0), time.Hour)
			})
			if ok, conflicts := tally(t, errs, store.ErrConflict); ok != 1 || conflicts != n-1 {
				t.Errorf("%d installs succeeded and %d conflicted, want 1 and %d", ok, conflicts, n-1)
			}
			if ks := listKeys(t, ctx, s); len(ks) != 1 {
				t.Errorf("ListTicketKeys = %v, want one key", keyIDs(ks))
			}
		}},
		{"concurrent rotations: exactly one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			mustRotateKey(t, ctx, s, "", ticketKey("k1", time.Hour), time.Hour)
			const n = 8
			errs := concurrently(n, func(i int) error {
				return s.RotateTicketKey(ctx, "k1", ticketKey(fmt.Sprintf("n%d", i), 0), time.Hour)
			})
			winner := ""
			for i, err := range errs {
				if err == nil {
					winner = fmt.Sprintf("n%d", i)
				}
			}
			if ok, conflicts := tally(t, errs, store.ErrConflict); ok != 1 || conflicts != n-1 {
				t.Fatalf("%d rotations succeeded and %d conflicted, want 1 and %d", ok, conflicts, n-1)
			}
			ks := listKeys(t, ctx, s)
			if len(ks) != 2 || ks[0].ID != winner || ks[0].Status != store.TicketKeyActive ||
				ks[1].ID != "k1" || ks[1].Status != store.TicketKeyRetired {
				t.Errorf("ListTicketKeys = %+v, want %s active and k1 retired, nothing else", ks, winner)
			}
		}},
	}
	return cases
}
