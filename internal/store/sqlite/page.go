package sqlite

import (
	"context"

	"github.com/muster-dev/muster/internal/store"
)

// ListTokensPage returns up to limit tokens after the key, in ListTokens'
// order, from the tokens_list_order index.
func (s *SQLite) ListTokensPage(ctx context.Context, after store.TokenKey, limit int) ([]store.Token, error) {
	// The zero key's CreatedAt is year 1, before every stored time.
	rows, err := s.r.QueryContext(ctx, `SELECT `+tokenColumns+` FROM tokens
		WHERE (created_at, id) > (?, ?) ORDER BY created_at, id LIMIT ?`,
		after.CreatedAt.UnixMicro(), after.ID, limit)
	if err != nil {
		return nil, wrap("list tokens", err)
	}
	ts, err := collect(rows, "list tokens", scanToken)
	if err != nil {
		return nil, err
	}
	if err := withBoundKeypairs(ctx, s.r, ts); err != nil {
		return nil, wrap("list tokens", err)
	}
	return ts, nil
}
