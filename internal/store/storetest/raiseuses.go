package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// raiseUsesCases: the uses a store restored from a backup forgot, taken
// again (muster store reapply): a single-use token spent since the
// backup admits no one, a count is never lowered nor raised past the
// token's allowed uses, and the write is audited or not made.
func raiseUsesCases() []testCase {
	uses := func(t *testing.T, ctx context.Context, s store.Store, id string) int64 {
		t.Helper()
		tok, err := s.GetToken(ctx, id)
		mustNil(t, "GetToken "+id, err)
		return tok.UsesCount
	}
	return []testCase{
		{"a single-use token raised admits no one", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("t1", 1, time.Time{}, time.Hour))
			seq := auditSeq(t, ctx, s)
			mustNil(t, "RaiseTokenUses", s.RaiseTokenUses(ctx, "t1", 1, link(record("store.reapply"))))
			wantEqual(t, "records appended", auditSeq(t, ctx, s), seq+1)
			wantEqual(t, "uses", uses(t, ctx, s, "t1"), 1)
			_, err := s.CommitJoin(ctx, newJoin("t1", "node-1", "i1", "key-1", at(0)))
			wantErr(t, "CommitJoin with the raised token", err, store.ErrTokenSpent)
		}},
		{"never down, never past the allowed uses", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("t3", 3, time.Time{}, time.Hour))
			mustJoin(t, ctx, s, newJoin("t3", "node-1", "i1", "key-1", at(0)))
			mustJoin(t, ctx, s, newJoin("t3", "node-2", "i2", "key-2", at(0)))
			seq := auditSeq(t, ctx, s)
			for _, n := range []int64{1, 2} {
				wantErr(t, "RaiseTokenUses to a count it has passed", s.RaiseTokenUses(ctx, "t3", n, link(record("store.reapply"))), store.ErrConflict)
			}
			wantEqual(t, "records appended by refused raises", auditSeq(t, ctx, s), seq)
			wantEqual(t, "uses after refused raises", uses(t, ctx, s, "t3"), 2)
			mustNil(t, "RaiseTokenUses past the allowed uses", s.RaiseTokenUses(ctx, "t3", 7, link(record("store.reapply"))))
			wantEqual(t, "uses", uses(t, ctx, s, "t3"), 3)
		}},
		{"unlimited or gone", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("tu", 0, time.Time{}, time.Hour))
			seq := auditSeq(t, ctx, s)
			wantErr(t, "RaiseTokenUses of an unlimited token", s.RaiseTokenUses(ctx, "tu", 4, link(record("store.reapply"))), store.ErrConflict)
			wantErr(t, "RaiseTokenUses of no token", s.RaiseTokenUses(ctx, "nope", 1, link(record("store.reapply"))), store.ErrNotFound)
			wantEqual(t, "records appended", auditSeq(t, ctx, s), seq)
			wantEqual(t, "uses", uses(t, ctx, s, "tu"), 0)
		}},
		{"an unaudited raise changes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("t1", 1, time.Time{}, time.Hour))
			wantUnaudited(t, ctx, s, "store.reapply", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.RaiseTokenUses(ctx, "t1", 1, audit)
			}, func() any { return uses(t, ctx, s, "t1") })
		}},
		{"one of racing raises wins", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("t1", 1, time.Time{}, time.Hour))
			won := raceAppends(t, ctx, s, 8, func(int) error {
				return s.RaiseTokenUses(ctx, "t1", 1, link(record("store.reapply")))
			})
			wantEqual(t, "raises that won", won, 1)
		}},
	}
}
