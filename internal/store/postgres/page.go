package postgres

import (
	"context"

	"github.com/muster-dev/muster/internal/store"
)

// ListTokensPage returns up to limit tokens after the key, in ListTokens'
// order, from the tokens_list_order index.
func (s *Store) ListTokensPage(ctx context.Context, after store.TokenKey, limit int) ([]store.Token, error) {
	// The zero key's CreatedAt is year 1, before every stored time.
	rows, err := s.pool.Query(ctx, `SELECT `+tokenReadColumns+` FROM tokens
		WHERE (created_at, id) > ($1, $2) ORDER BY created_at, id LIMIT $3`,
		after.CreatedAt.UnixMicro(), after.ID, limit)
	if err != nil {
		return nil, wrap("list tokens", err)
	}
	ts, err := collect(rows, "list tokens", scanToken)
	if err != nil {
		return nil, err
	}
	if err := withBoundKeypairs(ctx, s.pool, ts); err != nil {
		return nil, wrap("list tokens", err)
	}
	return ts, nil
}
