package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/store"
)

func tokenCountCases() []testCase {
	return []testCase{
		{"counts agree with each token's state", func(t *testing.T, ctx context.Context, s store.Store) {
			now := at(0)
			tokens := []store.Token{
				token("fresh", 1, at(time.Hour), time.Hour),
				token("forever", 1, time.Time{}, time.Hour),
				token("unlimited", 0, at(time.Hour), time.Hour),
				token("used-up", 2, at(time.Hour), time.Hour),
				token("expired", 1, at(-time.Second), time.Hour),
				token("expires-now", 1, now, time.Hour),
				token("expired-and-used-up", 1, at(-time.Hour), 2*time.Hour),
				token("used-up-forever", 1, time.Time{}, time.Hour),
			}
			tokens[2].UsesCount = 1000
			tokens[3].UsesCount = 2
			tokens[6].UsesCount = 1
			tokens[7].UsesCount = 1
			var want store.TokenCounts
			for _, tok := range tokens {
				mustNil(t, "InsertToken", s.InsertToken(ctx, tok, link(record("token.create"))))
				switch (jointoken.Usage{ExpiresAt: tok.ExpiresAt, UsesAllowed: tok.UsesAllowed, UsesCount: tok.UsesCount}).State(now) {
				case jointoken.StateExpired:
					want.Expired++
				case jointoken.StateUsedUp:
					want.UsedUp++
				default:
					want.Active++
				}
			}
			got, err := s.CountTokens(ctx, now)
			mustNil(t, "CountTokens", err)
			wantEqual(t, fmt.Sprintf("CountTokens at %s", now), got, want)
			if want != (store.TokenCounts{Active: 3, Expired: 3, UsedUp: 2}) {
				t.Errorf("the table's own states: %+v", want)
			}
		}},
		{"empty", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.CountTokens(ctx, at(0))
			mustNil(t, "CountTokens", err)
			wantEqual(t, "CountTokens", got, store.TokenCounts{})
		}},
	}
}
