package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

const ticketKeyColumns = `id, public_key, ciphertext, nonce, status, created_at, retired_at, publish_until`

// ListTicketKeys returns every ticket key, newest first (ties by ID,
// descending).
func (s *SQLite) ListTicketKeys(ctx context.Context) ([]store.TicketKey, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+ticketKeyColumns+`
		FROM ticket_keys ORDER BY created_at DESC, id DESC`)
	if err != nil {
		return nil, wrap("list ticket keys", err)
	}
	return collect(rows, "list ticket keys", scanTicketKey)
}

// RotateTicketKey makes next the active ticket key (see
// store.DiscoveryStore) as one write of a group-committed transaction on
// the single writer, so the check that fromID is still the active key (or, for
// fromID "", that there is none) is made in the transaction that acts on
// it: of two rotations from one key the second finds it retired and
// conflicts. The partial unique index ticket_keys_one_active backs this up.
// An overlap of zero or less retires fromID with PublishUntil equal to its
// RetiredAt: it leaves the JWKS at once and the next
// DeleteRetiredTicketKeys drops it. On any error nothing is written.
func (s *SQLite) RotateTicketKey(ctx context.Context, fromID string, next store.TicketKey, overlap time.Duration) error {
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		return rotateTicketKey(ctx, tx, fromID, next, overlap)
	})
}

// rotateTicketKey is RotateTicketKey's work inside the write transaction.
func rotateTicketKey(ctx context.Context, tx *writeTx, fromID string, k store.TicketKey, overlap time.Duration) error {
	// One reading of the clock, so the retirement, the end of publication
	// and a defaulted creation time agree.
	var now int64
	if err := tx.QueryRowContext(ctx, `SELECT `+nowMicros).Scan(&now); err != nil {
		return wrap("rotate ticket key: now", err)
	}
	if fromID == "" {
		var active string
		err := tx.QueryRowContext(ctx, `SELECT id FROM ticket_keys WHERE status = 'active'`).Scan(&active)
		switch {
		case err == nil:
			return fmt.Errorf("sqlite: rotate ticket key: %s is active: %w", active, store.ErrConflict)
		case !errors.Is(err, sql.ErrNoRows):
			return wrap("rotate ticket key", err)
		}
	} else {
		res, err := tx.ExecContext(ctx, `UPDATE ticket_keys
			SET status = 'retired', retired_at = ?, publish_until = ?
			WHERE id = ? AND status = 'active'`,
			now, now+max(overlap, 0).Microseconds(), fromID)
		if err != nil {
			return wrap("rotate ticket key: retire", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("rotate ticket key: retire", err)
		}
		if n == 0 {
			return fmt.Errorf("sqlite: rotate ticket key: %s is not the active key: %w", fromID, store.ErrConflict)
		}
	}

	created := timeArg(k.CreatedAt)
	if created == nil {
		created = now
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO ticket_keys (`+ticketKeyColumns+`)
		VALUES (?, ?, ?, ?, 'active', ?, NULL, NULL)`,
		k.ID, k.PublicKey, k.Ciphertext, k.Nonce, created); err != nil {
		return wrap("rotate ticket key: insert", err)
	}
	return nil
}

// DeleteRetiredTicketKeys drops the retired keys whose publication has
// ended by the store clock (PublishUntil at or before now) and returns
// their IDs in ascending order.
func (s *SQLite) DeleteRetiredTicketKeys(ctx context.Context) ([]string, error) {
	var ids []string
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		ids = nil
		rows, err := tx.QueryContext(ctx, `DELETE FROM ticket_keys
			WHERE status = 'retired' AND publish_until <= `+nowMicros+`
			RETURNING id`)
		if err != nil {
			return wrap("delete retired ticket keys", err)
		}
		ids, err = collect(rows, "delete retired ticket keys", func(row scanner) (string, error) {
			var id string
			return id, row.Scan(&id)
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	// RETURNING yields rows in no particular order.
	slices.Sort(ids)
	return ids, nil
}

func scanTicketKey(row scanner) (store.TicketKey, error) {
	var (
		k                         store.TicketKey
		created, retired, publish sql.NullInt64
	)
	if err := row.Scan(&k.ID, &k.PublicKey, &k.Ciphertext, &k.Nonce, &k.Status,
		&created, &retired, &publish); err != nil {
		return store.TicketKey{}, err
	}
	k.CreatedAt, k.RetiredAt, k.PublishUntil = timeCol(created), timeCol(retired), timeCol(publish)
	return k, nil
}
