package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// tokenUseCases: the uses of a token of unlimited uses, which a store may
// record apart from the token's row (the PostgreSQL store does), read
// back whole, go with the token, and never outlive its deletion.
func tokenUseCases() []testCase {
	return []testCase{
		{"unlimited token counts and dates its uses", func(t *testing.T, ctx context.Context, s store.Store) {
			tok := token("t1", 0, time.Time{}, time.Hour)
			tok.UsesCount, tok.LastUsedAt = 5, at(-time.Hour) // carried over from another store
			insertTokens(t, ctx, s, tok)
			from := storeNow(t, ctx, s)
			for i := range 3 {
				id := fmt.Sprint(i)
				mustJoin(t, ctx, s, newJoin("t1", "node-"+id, "i"+id, "key-"+id, at(0)))
			}
			to := storeNow(t, ctx, s).Add(time.Microsecond)
			snapshot(t, ctx, s).withTokenUse(t, ctx, s, "t1", 8, from, to)
			listed, err := s.ListTokensPage(ctx, store.TokenKey{}, 10)
			mustNil(t, "ListTokensPage", err)
			if len(listed) != 1 || listed[0].UsesCount != 8 || listed[0].LastUsedAt.Before(from) || listed[0].LastUsedAt.After(to) {
				t.Errorf("ListTokensPage = %+v, want t1 with 8 uses, the last within [%v, %v]", listed, from, to)
			}
		}},
		{"unlimited token's uses go with it", func(t *testing.T, ctx context.Context, s store.Store) {
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour))
			mustJoin(t, ctx, s, newJoin("t1", "node-1", "i1", "key-1", at(0)))
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "t1", link(record("token.delete"))))
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour))
			got, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken", err)
			if got.UsesCount != 0 || !got.LastUsedAt.IsZero() {
				t.Errorf("a new token of a deleted one's ID has %d uses, the last at %v; want none", got.UsesCount, got.LastUsedAt)
			}
		}},
		{"expired unlimited token's uses go with it", func(t *testing.T, ctx context.Context, s store.Store) {
			now := storeNow(t, ctx, s)
			insertTokens(t, ctx, s, token("t1", 0, now.Add(time.Second), time.Hour))
			mustJoin(t, ctx, s, newJoin("t1", "node-1", "i1", "key-1", now))
			for {
				if storeNow(t, ctx, s).After(now.Add(time.Second)) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			ids, err := s.DeleteExpiredTokens(ctx, 0, cleanupLink)
			mustNil(t, "DeleteExpiredTokens", err)
			wantEqual(t, "DeleteExpiredTokens", ids, []string{"t1"})
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour))
			got, err := s.GetToken(ctx, "t1")
			mustNil(t, "GetToken", err)
			if got.UsesCount != 0 {
				t.Errorf("a new token of an expired one's ID has %d uses, want 0", got.UsesCount)
			}
		}},
		{"join racing the token's deletion commits before it or not at all", func(t *testing.T, ctx context.Context, s store.Store) {
			// Joiners join with one unlimited token, each in a loop, until
			// the token is gone; once some have joined, the token is
			// deleted and a marker appended to the audit chain. Every join
			// appends its record in its own transaction, so a join that
			// committed after the deletion would have a record after the
			// marker.
			insertTokens(t, ctx, s, token("t1", 0, time.Time{}, time.Hour))
			const joiners, before = 8, 10
			var (
				joined   atomic.Int64
				wg       sync.WaitGroup
				mu       sync.Mutex
				problems []error
			)
			for g := range joiners {
				wg.Go(func() {
					for k := 0; ; k++ {
						id := fmt.Sprintf("%d-%d", g, k)
						j := newJoin("t1", "node-"+id, "i-"+id, "key-"+id, at(0))
						j.Audit = link(record("agent.join"))
						_, err := s.CommitJoin(ctx, j)
						switch {
						case err == nil:
							joined.Add(1)
							continue
						case !errors.Is(err, store.ErrNotFound):
							mu.Lock()
							problems = append(problems, err)
							mu.Unlock()
						}
						return
					}
				})
			}
			for joined.Load() < before && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			mustNil(t, "DeleteToken", s.DeleteToken(ctx, "t1", link(record("token.delete"))))
			marker, err := s.AppendAudit(ctx, link(record("marker")))
			mustNil(t, "AppendAudit", err)
			wg.Wait()
			for _, err := range problems {
				t.Errorf("CommitJoin: %v, want nil or ErrNotFound", err)
			}
			recs, err := s.ListAudit(ctx, store.AuditFilter{Action: "agent.join", Limit: 100000})
			mustNil(t, "ListAudit", err)
			if int64(len(recs)) != joined.Load() {
				t.Errorf("%d join records for %d joins", len(recs), joined.Load())
			}
			for _, r := range recs {
				if r.Seq > marker.Seq {
					t.Errorf("a join committed after the token's deletion: record %d, deletion before %d", r.Seq, marker.Seq)
				}
			}
			nodes, err := s.ListNodes(ctx)
			mustNil(t, "ListNodes", err)
			if int64(len(nodes)) != joined.Load() {
				t.Errorf("%d nodes for %d joins", len(nodes), joined.Load())
			}
			if _, err := s.GetToken(ctx, "t1"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("GetToken after the deletion = %v, want ErrNotFound", err)
			}
		}},
	}
}
