package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// token returns an unused token with every field set, created age before
// base. A zero expiresAt never expires; expiries of tokens a join is to use
// must be relative to the store clock, not to base.
func token(id string, usesAllowed int64, expiresAt time.Time, age time.Duration) store.Token {
	return store.Token{
		ID:          id,
		JoinMethod:  store.JoinMethodToken,
		Ciphertext:  []byte("sealed-" + id),
		Nonce:       []byte("nonce-" + id),
		UsesAllowed: usesAllowed,
		ExpiresAt:   expiresAt,
		Description: "token " + id,
		Labels:      map[string]string{"env": "test", "token": id},
		CreatedBy:   "admin",
		CreatedAt:   at(-age),
	}
}

// tokenIDs returns the IDs of ts in order.
func tokenIDs(ts []store.Token) []string {
	var ids []string
	for _, t := range ts {
		ids = append(ids, t.ID)
	}
	return ids
}

func tokenCases() []testCase {
	cases := []testCase{
		{"empty", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			if len(got) != 0 {
				t.Errorf("ListTokens on an empty store = %v, want none", got)
			}
			_, err = s.GetToken(ctx, "nope")
			wantErr(t, "GetToken", err, store.ErrNotFound)
			wantErr(t, "DeleteToken", s.DeleteToken(ctx, "nope", link(record("token.delete"))), store.ErrNotFound)
			ids, err := s.DeleteExpiredTokens(ctx, 0, cleanupLink)
			mustNil(t, "DeleteExpiredTokens", err)
			if len(ids) != 0 {
				t.Errorf("DeleteExpiredTokens on an empty store = %v, want none", ids)
			}
		}},
		{"an unaudited cleanup deletes no token", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			mustNil(t, "InsertToken", s.InsertToken(ctx, token("old", 1, now.Add(-3*time.Hour), 4*time.Hour), link(record("token.create"))))
			mustNil(t, "InsertToken", s.InsertToken(ctx, token("live", 1, now.Add(time.Hour), time.Hour), link(record("token.create"))))
			all := func() any {
				ts, err := s.ListTokens(ctx)
				mustNil(t, "ListTokens", err)
				return tokenIDs(ts)
			}
			var named []string
			wantUnaudited(t, ctx, s, "token.cleanup", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				gone, err := s.DeleteExpiredTokens(ctx, time.Hour, func(ids []string) func(store.AuditHead) (store.AuditRecord, error) {
					named = ids
					return audit
				})
				if err == nil && len(gone) == 0 {
					return errors.New("nothing deleted")
				}
				return err
			}, all)
			wantEqual(t, "IDs the unaudited cleanup's record was built for", named, []string{"old"})
			seq := auditSeq(t, ctx, s)
			gone, err := s.DeleteExpiredTokens(ctx, time.Hour, cleanupLink)
			mustNil(t, "DeleteExpiredTokens with its record", err)
			wantEqual(t, "deleted", gone, []string{"old"})
			gone, err = s.DeleteExpiredTokens(ctx, time.Hour, func([]string) func(store.AuditHead) (store.AuditRecord, error) {
				t.Error("DeleteExpiredTokens asked for a record with nothing to delete")
				return link(record("token.cleanup"))
			})
			mustNil(t, "DeleteExpiredTokens with nothing to delete", err)
			wantEqual(t, "deleted", len(gone), 0)
			if got := auditSeq(t, ctx, s); got != seq+1 {
				t.Fatalf("audit chain holds %d records after a cleanup and an empty one; want %d", got, seq+1)
			}
		}},
		{"a token is created and deleted with its audit record, one each", func(t *testing.T, ctx context.Context, s store.Store) {
			seq := auditSeq(t, ctx, s)
			mustNil(t, "InsertToken", s.InsertToken(ctx, token("t1", 1, at(time.Hour), 0), link(record("token.create"))))
			mustNil(t, "InsertToken bound", s.InsertToken(ctx, bkToken("bk1", "node-1", 1, store.RecoveryStandard), link(record("token.create"))))
			wantErr(t, "InsertToken of an ID held", s.InsertToken(ctx, token("t1", 1, at(time.Hour), 0), link(record("token.create"))), store.ErrConflict)
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "t1", link(record("token.delete"))))
			wantErr(t, "DeleteToken twice", s.DeleteToken(ctx, "t1", link(record("token.delete"))), store.ErrNotFound)
			recs, err := s.ListAudit(ctx, store.AuditFilter{AfterSeq: seq})
			mustNil(t, "ListAudit", err)
			var got []string
			for _, r := range recs {
				got = append(got, r.Action)
			}
			wantEqual(t, "records of the token writes", got, []string{"token.create", "token.create", "token.delete"})
		}},
		{"a token whose audit record cannot be written is neither created nor deleted", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertToken", s.InsertToken(ctx, token("held", 1, at(time.Hour), 0), link(record("token.create"))))
			all := func() any {
				got, err := s.ListTokens(ctx)
				mustNil(t, "ListTokens", err)
				return got
			}
			for _, tok := range []store.Token{token("t2", 1, at(time.Hour), 0), bkToken("bk2", "node-2", 1, store.RecoveryStandard)} {
				wantUnaudited(t, ctx, s, "token.create", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
					return s.InsertToken(ctx, tok, audit)
				}, all)
			}
			wantUnaudited(t, ctx, s, "token.delete", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.DeleteToken(ctx, "held", audit)
			}, all)
			// The IDs are free, and the token still there, for writes
			// that carry their record.
			mustNil(t, "InsertToken bk2", s.InsertToken(ctx, bkToken("bk2", "node-2", 1, store.RecoveryStandard), link(record("token.create"))))
			mustNil(t, "DeleteToken held", s.DeleteToken(ctx, "held", link(record("token.delete"))))
		}},
		{"tokens created and deleted beside other appends keep the chain whole", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 6
			won := raceAppends(t, ctx, s, n, func(i int) error {
				return s.InsertToken(ctx, token(fmt.Sprintf("race-%d", i%3), 1, at(time.Hour), 0), link(record("token.create")))
			})
			if won != 3 {
				t.Fatalf("%d of %d inserts of 3 IDs succeeded; want 3", won, n)
			}
			won = raceAppends(t, ctx, s, n, func(i int) error {
				return s.DeleteToken(ctx, fmt.Sprintf("race-%d", i%3), link(record("token.delete")))
			})
			if won != 3 {
				t.Fatalf("%d of %d deletes of 3 tokens succeeded; want 3", won, n)
			}
		}},
		{"every field round-trips", func(t *testing.T, ctx context.Context, s store.Store) {
			tok := token("t1", 5, at(24*time.Hour), time.Hour)
			tok.UsesCount = 2
			tok.NodeID = "node-1"
			tok.JoinMethod = store.JoinMethodBoundKeypair
			tok.Ciphertext = []byte{0, 1, 0xfe, 0xff}
			tok.LastUsedAt = at(-time.Minute)
			tok.Labels = map[string]string{"a": "1", "quote\"d": "ünïcode", "": "empty key"}
			tok.SVIDUsage = store.SVIDUsageClientServer
			mustNil(t, "InsertToken", s.InsertToken(ctx, tok, link(record("token.create"))))
			got, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken", err)
			wantEqual(t, "GetToken", got, tok)
		}},
		{"zero times and no labels round-trip", func(t *testing.T, ctx context.Context, s store.Store) {
			// nil and empty labels alike come back empty.
			for _, tok := range []store.Token{
				{ID: "nil", JoinMethod: store.JoinMethodToken, Ciphertext: []byte{1}, Nonce: []byte{2}, CreatedAt: at(0)},
				{ID: "empty", JoinMethod: store.JoinMethodToken, Ciphertext: []byte{1}, Nonce: []byte{2}, CreatedAt: at(0),
					Labels: map[string]string{}},
			} {
				mustNil(t, "InsertToken "+tok.ID, s.InsertToken(ctx, tok, link(record("token.create"))))
				got, err := s.GetToken(ctx, tok.ID)
				mustNil(t, "GetToken "+tok.ID, err)
				wantEqual(t, "GetToken "+tok.ID, got, tok)
				if len(got.Labels) != 0 || !got.ExpiresAt.IsZero() || !got.LastUsedAt.IsZero() {
					t.Errorf("GetToken %s = %+v, want no labels and zero times", tok.ID, got)
				}
			}
		}},
		{"list oldest first", func(t *testing.T, ctx context.Context, s store.Store) {
			ts := []store.Token{
				token("b", 1, time.Time{}, time.Hour),
				token("c", 0, at(time.Hour), 2*time.Hour),
				token("a", 1, at(-time.Hour), time.Hour), // ties with b: by ID
				token("d", 3, time.Time{}, 0),
			}
			for _, tok := range ts {
				mustNil(t, "InsertToken "+tok.ID, s.InsertToken(ctx, tok, link(record("token.create"))))
			}
			got, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			wantEqual(t, "ListTokens", got, []store.Token{ts[1], ts[2], ts[0], ts[3]})
		}},
		{"duplicate id conflicts", func(t *testing.T, ctx context.Context, s store.Store) {
			first := token("t1", 1, time.Time{}, time.Hour)
			mustNil(t, "InsertToken", s.InsertToken(ctx, first, link(record("token.create"))))
			err := s.InsertToken(ctx, token("t1", 0, time.Time{}, 0), link(record("token.create")))
			wantErr(t, "InsertToken duplicate", err, store.ErrConflict)
			got, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			wantEqual(t, "ListTokens", got, []store.Token{first})
		}},
		{"delete", func(t *testing.T, ctx context.Context, s store.Store) {
			keep := token("keep", 1, time.Time{}, time.Hour)
			mustNil(t, "InsertToken", s.InsertToken(ctx, keep, link(record("token.create"))))
			mustNil(t, "InsertToken", s.InsertToken(ctx, token("t1", 1, time.Time{}, 0), link(record("token.create"))))
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "t1", link(record("token.delete"))))
			_, err := s.GetToken(ctx, "t1")
			wantErr(t, "GetToken after delete", err, store.ErrNotFound)
			wantErr(t, "DeleteToken twice", s.DeleteToken(ctx, "t1", link(record("token.delete"))), store.ErrNotFound)
			got, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			wantEqual(t, "ListTokens", got, []store.Token{keep})
		}},
		{"delete keeps the nodes it admitted", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			mustNil(t, "InsertToken", s.InsertToken(ctx, token("t1", 1, time.Time{}, 0), link(record("token.create"))))
			j := newJoin("t1", "node-1", "i1", "key-1", now)
			res, err := s.CommitJoin(ctx, j)
			mustNil(t, "CommitJoin", err)
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "t1", link(record("token.delete"))))
			n, err := s.GetNode(ctx, "node-1")
			mustNil(t, "GetNode", err)
			wantEqual(t, "GetNode", n, wantNode(j, now))
			in, err := s.GetInstance(ctx, "i1")
			mustNil(t, "GetInstance", err)
			wantEqual(t, "GetInstance", in, res.Instance)
			_, err = s.GetCertificate(ctx, j.Certificate.Serial)
			mustNil(t, "GetCertificate", err)
		}},
	}

	// Each retention case starts from tokens whose expiry is relative to
	// the store clock, an hour or more from any boundary.
	retentions := []struct {
		name      string
		retention time.Duration
		deleted   []string
	}{
		{"retention 2h keeps a token expired 1h ago", 2 * time.Hour, []string{"expired-3h"}},
		{"retention 30m deletes a token expired 1h ago", 30 * time.Minute, []string{"expired-1h", "expired-3h"}},
		{"retention 0 deletes every expired token", 0, []string{"expired-1h", "expired-3h"}},
		{"retention 5h deletes nothing", 5 * time.Hour, nil},
	}
	for _, rc := range retentions {
		cases = append(cases, testCase{rc.name, func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			ts := []store.Token{
				token("expired-3h", 1, now.Add(-3*time.Hour), 4*time.Hour),
				token("expired-1h", 1, now.Add(-time.Hour), 3*time.Hour),
				token("live", 1, now.Add(time.Hour), 2*time.Hour),
				token("never", 1, time.Time{}, time.Hour),
			}
			for _, tok := range ts {
				mustNil(t, "InsertToken "+tok.ID, s.InsertToken(ctx, tok, link(record("token.create"))))
			}
			got, err := s.DeleteExpiredTokens(ctx, rc.retention, cleanupLink)
			mustNil(t, "DeleteExpiredTokens", err)
			wantEqual(t, "deleted IDs", got, rc.deleted)

			var kept []string
			for _, tok := range ts {
				if !slices.Contains(rc.deleted, tok.ID) {
					kept = append(kept, tok.ID)
				}
			}
			left, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			wantEqual(t, "tokens left", tokenIDs(left), kept)
		}})
	}
	return cases
}
