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

const pskColumns = `id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at`

// pskLockKey serializes rotations of the bootstrap PSK, in the single-bigint
// key space beside migrateLockKey and auditLockKey ("muster" + 3).
const pskLockKey int64 = 0x6d75737465720003

// InsertPSK adds a PSK. ErrConflict if its ID exists, or if another PSK
// already has its status and that status is active or grace: the partial
// unique index bootstrap_psks_one_per_live_status enforces the invariant
// across processes.
func (s *Store) InsertPSK(ctx context.Context, p store.PSK) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO bootstrap_psks
		(id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		p.ID, p.Ciphertext, p.Nonce, p.Status,
		timeArg(p.CreatedAt), timeArg(p.GraceExpiresAt), timeArg(p.RevokedAt))
	if err != nil {
		return wrap("insert psk", err)
	}
	return nil
}

// ListPSKs returns every PSK, newest first (ties by ID, descending).
func (s *Store) ListPSKs(ctx context.Context) ([]store.PSK, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+pskColumns+`
		FROM bootstrap_psks ORDER BY created_at DESC, id DESC`)
	if err != nil {
		return nil, wrap("list psks", err)
	}
	return collect(rows, "list psks", scanPSK)
}

// RotatePSK replaces the active PSK fromID with newPSK (see store.Store) in
// one READ COMMITTED transaction that first takes
// pg_advisory_xact_lock(pskLockKey): rotations in every process take turns,
// and the state read after the lock is granted includes every rotation
// committed before, so of two rotations from one active PSK the second
// finds it in grace and conflicts. On any error nothing is written.
func (s *Store) RotatePSK(ctx context.Context, fromID string, p store.PSK, grace time.Duration) (store.PSK, error) {
	var old store.PSK
	err := s.inTx(ctx, "rotate psk", func(tx pgx.Tx) error {
		var err error
		old, err = rotatePSK(ctx, tx, fromID, p, grace)
		return err
	})
	if err != nil {
		return store.PSK{}, err
	}
	return old, nil
}

// rotatePSK is RotatePSK's work inside the transaction.
func rotatePSK(ctx context.Context, tx pgx.Tx, fromID string, p store.PSK, grace time.Duration) (store.PSK, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, pskLockKey); err != nil {
		return store.PSK{}, wrap("rotate psk: lock", err)
	}
	// One reading of the clock, after the lock: the revocation, the grace
	// expiry and a defaulted creation time agree.
	var now int64
	if err := tx.QueryRow(ctx, `SELECT `+nowMicros).Scan(&now); err != nil {
		return store.PSK{}, wrap("rotate psk: now", err)
	}
	var status string
	err := tx.QueryRow(ctx, `SELECT status FROM bootstrap_psks WHERE id = $1 FOR UPDATE`, fromID).Scan(&status)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return store.PSK{}, wrap("rotate psk", err)
	}
	if status != store.PSKActive {
		return store.PSK{}, fmt.Errorf("postgres: rotate psk: %s is not the active psk: %w", fromID, store.ErrConflict)
	}

	// The grace slot is freed first: the partial unique index admits one
	// grace PSK.
	if _, err := tx.Exec(ctx, `UPDATE bootstrap_psks
		SET status = 'revoked', grace_expires_at = NULL, revoked_at = $1
		WHERE status = 'grace'`, now); err != nil {
		return store.PSK{}, wrap("rotate psk: revoke grace", err)
	}
	if grace > 0 {
		_, err = tx.Exec(ctx, `UPDATE bootstrap_psks
			SET status = 'grace', grace_expires_at = $1 WHERE id = $2`, now+grace.Microseconds(), fromID)
	} else {
		_, err = tx.Exec(ctx, `UPDATE bootstrap_psks
			SET status = 'revoked', revoked_at = $1 WHERE id = $2`, now, fromID)
	}
	if err != nil {
		return store.PSK{}, wrap("rotate psk: retire active", err)
	}

	created := timeArg(p.CreatedAt)
	if created == nil {
		created = now
	}
	if _, err := tx.Exec(ctx, `INSERT INTO bootstrap_psks (`+pskColumns+`)
		VALUES ($1, $2, $3, 'active', $4, NULL, NULL)`,
		p.ID, p.Ciphertext, p.Nonce, created); err != nil {
		return store.PSK{}, wrap("rotate psk: insert", err)
	}
	old, err := scanPSK(tx.QueryRow(ctx, `SELECT `+pskColumns+` FROM bootstrap_psks WHERE id = $1`, fromID))
	if err != nil {
		return store.PSK{}, wrap("rotate psk: read back", err)
	}
	return old, nil
}

// RevokeExpiredGracePSKs revokes the grace PSKs whose grace has ended by
// the store clock and returns their IDs in ascending order. It is one
// UPDATE: a row a concurrent rotation revoked first is no longer grace when
// PostgreSQL re-checks it, so no PSK is revoked twice.
func (s *Store) RevokeExpiredGracePSKs(ctx context.Context) ([]string, error) {
	// A cleaner: what expired since it last ran may be many rows, so it
	// is bounded by longRequestTimeout, not the store's request timeout.
	ctx = long(ctx)
	rows, err := s.pool.Query(ctx, `UPDATE bootstrap_psks
		SET status = 'revoked', grace_expires_at = NULL, revoked_at = `+nowMicros+`
		WHERE status = 'grace' AND grace_expires_at <= `+nowMicros+`
		RETURNING id`)
	if err != nil {
		return nil, wrap("revoke expired grace psks", err)
	}
	ids, err := collect(rows, "revoke expired grace psks", func(row pgx.Row) (string, error) {
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

func scanPSK(row pgx.Row) (store.PSK, error) {
	var (
		p                       store.PSK
		created, grace, revoked *int64
	)
	if err := row.Scan(&p.ID, &p.Ciphertext, &p.Nonce, &p.Status, &created, &grace, &revoked); err != nil {
		return store.PSK{}, err
	}
	p.CreatedAt, p.GraceExpiresAt, p.RevokedAt = timeCol(created), timeCol(grace), timeCol(revoked)
	return p, nil
}
