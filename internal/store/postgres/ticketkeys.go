package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const ticketKeyColumns = `id, public_key, ciphertext, nonce, status, created_at, retired_at, publish_until`

// ListTicketKeys returns every ticket key, newest first (ties by ID,
// descending).
func (s *Store) ListTicketKeys(ctx context.Context) ([]store.TicketKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+ticketKeyColumns+`
		FROM ticket_keys ORDER BY created_at DESC, id DESC`)
	if err != nil {
		return nil, wrap("list ticket keys", err)
	}
	return collect(rows, "list ticket keys", scanTicketKey)
}

// RotateTicketKey makes next the active ticket key (see
// store.DiscoveryStore) in one READ COMMITTED transaction. A rotation from
// a key first locks its row (SELECT … FOR UPDATE): concurrent rotations
// from one key queue on that lock, and each later one reads the row as the
// winner committed it, retired, and conflicts. Installing the first key
// (fromID "") relies on the partial unique index ticket_keys_one_active,
// which also backs up the rotation: an insert beside an active key fails.
// An overlap of zero or less retires fromID with PublishUntil equal to its
// RetiredAt: it leaves the JWKS at once and the next
// DeleteRetiredTicketKeys drops it. On any error nothing is written.
func (s *Store) RotateTicketKey(ctx context.Context, fromID string, next store.TicketKey, overlap time.Duration) error {
	return s.inTx(ctx, "rotate ticket key", func(tx pgx.Tx) error {
		return rotateTicketKey(ctx, tx, fromID, next, overlap)
	})
}

// rotateTicketKey is RotateTicketKey's work inside the transaction.
func rotateTicketKey(ctx context.Context, tx pgx.Tx, fromID string, k store.TicketKey, overlap time.Duration) error {
	if fromID != "" {
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM ticket_keys WHERE id = $1 FOR UPDATE`, fromID).Scan(&status)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return wrap("rotate ticket key", err)
		}
		if status != store.TicketKeyActive {
			return fmt.Errorf("postgres: rotate ticket key: %s is not the active key: %w", fromID, store.ErrConflict)
		}
	}
	// One reading of the clock, after the lock: the retirement, the end of
	// publication and a defaulted creation time agree.
	var now int64
	if err := tx.QueryRow(ctx, `SELECT `+nowMicros).Scan(&now); err != nil {
		return wrap("rotate ticket key: now", err)
	}
	if fromID != "" {
		if _, err := tx.Exec(ctx, `UPDATE ticket_keys
			SET status = 'retired', retired_at = $1, publish_until = $2
			WHERE id = $3`,
			now, now+max(overlap, 0).Microseconds(), fromID); err != nil {
			return wrap("rotate ticket key: retire", err)
		}
	}

	created := timeArg(k.CreatedAt)
	if created == nil {
		created = now
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ticket_keys (`+ticketKeyColumns+`)
		VALUES ($1, $2, $3, $4, 'active', $5, NULL, NULL)`,
		k.ID, k.PublicKey, k.Ciphertext, k.Nonce, created); err != nil {
		if constraintOf(err) == "ticket_keys_one_active" {
			return fmt.Errorf("postgres: rotate ticket key: another key is active: %w", store.ErrConflict)
		}
		return wrap("rotate ticket key: insert", err)
	}
	return nil
}

// DeleteRetiredTicketKeys drops the retired keys whose publication has
// ended by the store clock (PublishUntil at or before now) and returns
// their IDs in ascending order.
func (s *Store) DeleteRetiredTicketKeys(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `DELETE FROM ticket_keys
		WHERE status = 'retired' AND publish_until <= `+nowMicros+`
		RETURNING id`)
	if err != nil {
		return nil, wrap("delete retired ticket keys", err)
	}
	ids, err := collect(rows, "delete retired ticket keys", func(row pgx.Row) (string, error) {
		var id string
		return id, row.Scan(&id)
	})
	if err != nil {
		return nil, err
	}
	// RETURNING yields rows in no particular order.
	slices.Sort(ids)
	return ids, nil
}

func scanTicketKey(row pgx.Row) (store.TicketKey, error) {
	var (
		k                         store.TicketKey
		created, retired, publish *int64
	)
	if err := row.Scan(&k.ID, &k.PublicKey, &k.Ciphertext, &k.Nonce, &k.Status,
		&created, &retired, &publish); err != nil {
		return store.TicketKey{}, err
	}
	k.CreatedAt, k.RetiredAt, k.PublishUntil = timeCol(created), timeCol(retired), timeCol(publish)
	return k, nil
}
