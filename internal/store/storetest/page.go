package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// allTokenPages walks ListTokensPage to the end, size at a time.
func allTokenPages(t *testing.T, ctx context.Context, s store.Store, size int, between func(page int)) []store.Token {
	t.Helper()
	var all []store.Token
	key := store.TokenKey{}
	for page := 0; ; page++ {
		ts, err := s.ListTokensPage(ctx, key, size)
		mustNil(t, "ListTokensPage", err)
		if len(ts) > size {
			t.Fatalf("ListTokensPage(limit %d) returned %d tokens", size, len(ts))
		}
		all = append(all, ts...)
		if len(ts) < size {
			return all
		}
		key = ts[len(ts)-1].KeyOf()
		if between != nil {
			between(page)
		}
	}
}

func pageCases() []testCase {
	return []testCase{
		{"token pages join up to the whole list, ties by ID", func(t *testing.T, ctx context.Context, s store.Store) {
			// Three tokens share each creation time, so a page boundary
			// falls inside a tie.
			for i := range 10 {
				insertTokens(t, ctx, s, token(fmt.Sprintf("t%02d", 9-i), 1, time.Time{}, time.Duration(i/3)*time.Minute))
			}
			want, err := s.ListTokens(ctx)
			mustNil(t, "ListTokens", err)
			for _, size := range []int{1, 2, 3, 4, 10, 11} {
				wantEqual(t, fmt.Sprintf("pages of %d", size), allTokenPages(t, ctx, s, size, nil), want)
			}
			empty, err := s.ListTokensPage(ctx, want[len(want)-1].KeyOf(), 5)
			mustNil(t, "ListTokensPage past the end", err)
			if len(empty) != 0 {
				t.Errorf("ListTokensPage past the end = %v, want none", tokenIDs(empty))
			}
		}},
		{"token pages across an insert and a delete", func(t *testing.T, ctx context.Context, s store.Store) {
			for i := range 6 {
				insertTokens(t, ctx, s, token(fmt.Sprintf("t%d", i), 1, time.Time{}, time.Duration(10-i)*time.Minute))
			}
			got := allTokenPages(t, ctx, s, 2, func(page int) {
				if page != 0 {
					return
				}
				// After t0 t1: delete one already listed and one not yet,
				// add one before the cursor and one after it.
				mustNil(t, "DeleteToken t0", s.DeleteToken(ctx, "t0", link(record("token.delete"))))
				mustNil(t, "DeleteToken t3", s.DeleteToken(ctx, "t3", link(record("token.delete"))))
				insertTokens(t, ctx, s, token("early", 1, time.Time{}, time.Hour), token("late", 1, time.Time{}, 0))
			})
			wantEqual(t, "listed", tokenIDs(got), []string{"t0", "t1", "t2", "t4", "t5", "late"})
		}},
		{"token pages during concurrent inserts and deletes", func(t *testing.T, ctx context.Context, s store.Store) {
			// The reader pages while writers add and remove tokens of
			// their own: every token present throughout is listed once,
			// in order, and nothing is listed twice.
			var stay []string
			for i := range 40 {
				id := fmt.Sprintf("s%02d", i)
				stay = append(stay, id)
				insertTokens(t, ctx, s, token(id, 1, time.Time{}, time.Duration(40-i)*time.Second))
			}
			var listed []store.Token
			errs := concurrently(3, func(w int) error {
				if w == 0 {
					key := store.TokenKey{}
					for {
						ts, err := s.ListTokensPage(ctx, key, 3)
						if err != nil {
							return err
						}
						listed = append(listed, ts...)
						if len(ts) < 3 {
							return nil
						}
						key = ts[len(ts)-1].KeyOf()
					}
				}
				for i := range 20 {
					id := fmt.Sprintf("w%d-%02d", w, i)
					if err := s.InsertToken(ctx, token(id, 1, time.Time{}, time.Duration(40-2*i)*time.Second), link(record("token.create"))); err != nil {
						return err
					}
					if i%2 == 0 {
						if err := s.DeleteToken(ctx, id, link(record("token.delete"))); err != nil {
							return err
						}
					}
				}
				return nil
			})
			tally(t, errs, nil)
			seen := map[string]bool{}
			for i, tok := range listed {
				if seen[tok.ID] {
					t.Errorf("token %s listed twice", tok.ID)
				}
				seen[tok.ID] = true
				if i > 0 && !keyBefore(listed[i-1].KeyOf(), tok.KeyOf()) {
					t.Errorf("token %s listed after %s, out of order", tok.ID, listed[i-1].ID)
				}
			}
			for _, id := range stay {
				if !seen[id] {
					t.Errorf("token %s, present throughout, not listed", id)
				}
			}
		}},
		{"node pages by ID", func(t *testing.T, ctx context.Context, s store.Store) {
			for i, id := range []string{"node-d", "node-b", "node-e", "node-a", "node-c"} {
				admit(t, ctx, s, id, fmt.Sprintf("i%d", i), at(time.Duration(i)*time.Minute))
			}
			// The agents' page is the node page: ListAgentsPage's node rows.
			nodesPage := func(after string, size int) ([]store.Node, error) {
				rows, err := s.ListAgentsPage(ctx, after, size)
				var ns []store.Node
				for _, r := range rows {
					ns = append(ns, r.Node)
				}
				return ns, err
			}
			want, err := s.ListNodes(ctx)
			mustNil(t, "ListNodes", err)
			for _, size := range []int{1, 2, 5, 6} {
				var got []store.Node
				after := ""
				for {
					ns, err := nodesPage(after, size)
					mustNil(t, "ListAgentsPage", err)
					got = append(got, ns...)
					if len(ns) < size {
						break
					}
					after = ns[len(ns)-1].ID
				}
				wantEqual(t, fmt.Sprintf("pages of %d", size), got, want)
			}
			// Across a delete and a join: the cursor is an ID, not a place.
			ns, err := nodesPage("", 2)
			mustNil(t, "ListAgentsPage", err)
			mustNil(t, "DeleteNode node-a", s.DeleteNode(ctx, "node-a", link(record("agent.delete"))))
			mustNil(t, "DeleteNode node-c", s.DeleteNode(ctx, "node-c", link(record("agent.delete"))))
			admit(t, ctx, s, "node-bb", "i9", at(time.Hour))
			rest, err := nodesPage(ns[len(ns)-1].ID, 10)
			mustNil(t, "ListAgentsPage", err)
			var ids []string
			for _, n := range slices.Concat(ns, rest) {
				ids = append(ids, n.ID)
			}
			wantEqual(t, "listed", ids, []string{"node-a", "node-b", "node-bb", "node-d", "node-e"})
		}},
	}
}

// keyBefore reports whether a comes before b in the token list order.
func keyBefore(a, b store.TokenKey) bool {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c < 0
	}
	return a.ID < b.ID
}
