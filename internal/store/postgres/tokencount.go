package postgres

import (
	"context"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// CountTokens counts the tokens by state at now in one query: expired
// (expires_at at or before now), else used up, else active.
func (s *Store) CountTokens(ctx context.Context, now time.Time) (store.TokenCounts, error) {
	var c store.TokenCounts
	var total int64
	err := s.pool.QueryRow(ctx, `SELECT
			COUNT(*),
			COUNT(*) FILTER (WHERE expires_at IS NOT NULL AND expires_at <= $1),
			COUNT(*) FILTER (WHERE NOT (expires_at IS NOT NULL AND expires_at <= $1) AND uses_allowed > 0 AND uses_count >= uses_allowed)
		FROM tokens`, timeArg(now)).Scan(&total, &c.Expired, &c.UsedUp)
	if err != nil {
		return store.TokenCounts{}, wrap("count tokens", err)
	}
	c.Active = total - c.Expired - c.UsedUp
	return c, nil
}
