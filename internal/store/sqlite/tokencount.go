package sqlite

import (
	"context"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// CountTokens counts the tokens by state at now in one query: expired
// (expires_at at or before now), else used up, else active.
func (s *SQLite) CountTokens(ctx context.Context, now time.Time) (store.TokenCounts, error) {
	var c store.TokenCounts
	var total int64
	err := s.r.QueryRowContext(ctx, `SELECT
			COUNT(*),
			COALESCE(SUM(expires_at IS NOT NULL AND expires_at <= ?1), 0),
			COALESCE(SUM(NOT (expires_at IS NOT NULL AND expires_at <= ?1) AND uses_allowed > 0 AND uses_count >= uses_allowed), 0)
		FROM tokens`, timeArg(now)).Scan(&total, &c.Expired, &c.UsedUp)
	if err != nil {
		return store.TokenCounts{}, wrap("count tokens", err)
	}
	c.Active = total - c.Expired - c.UsedUp
	return c, nil
}
