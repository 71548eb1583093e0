package postgres

import (
	"context"
	"errors"
	"fmt"
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
func (s *Store) InsertPSK(ctx context.Context, p store.PSK, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	op := "insert psk " + p.ID
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: a psk is never created unaudited", op)
	}
	return s.inPipe(ctx, op, func(pp *pipe) error {
		pp.exec(`INSERT INTO bootstrap_psks
			(id, ciphertext, nonce, status, created_at, grace_expires_at, revoked_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, []any{p.ID, p.Ciphertext, p.Nonce, p.Status,
			timeArg(p.CreatedAt), timeArg(p.GraceExpiresAt), timeArg(p.RevokedAt)}, wrapped("insert psk"))
		return commitAudited(ctx, pp, audit, op)
	})
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
func (s *Store) RotatePSK(ctx context.Context, fromID string, p store.PSK, grace time.Duration, audit func(store.AuditHead) (store.AuditRecord, error)) (store.PSK, error) {
	if audit == nil {
		return store.PSK{}, fmt.Errorf("postgres: rotate psk %s: no audit record: a psk is never rotated unaudited", fromID)
	}
	op := "rotate psk " + fromID
	var old store.PSK
	err := s.inPipe(ctx, op, func(pp *pipe) error {
		// One reading of the clock, after the lock: the revocation, the
		// grace expiry and a defaulted creation time agree.
		var (
			now    int64
			status string
		)
		pp.exec(`SELECT pg_advisory_xact_lock($1)`, []any{pskLockKey}, wrapped(op+": lock"))
		pp.row(`SELECT `+nowMicros, nil, func(row pgx.Row) error {
			if err := row.Scan(&now); err != nil {
				return wrap(op+": now", err)
			}
			return nil
		})
		pp.row(`SELECT status FROM bootstrap_psks WHERE id = $1 FOR UPDATE`, []any{fromID}, func(row pgx.Row) error {
			if err := row.Scan(&status); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return wrap(op, err)
			}
			return nil
		})
		if err := pp.send(ctx); err != nil {
			return err
		}
		if status != store.PSKActive {
			return fmt.Errorf("postgres: rotate psk: %s is not the active psk: %w", fromID, store.ErrConflict)
		}
		// The grace slot is freed first: the partial unique index admits
		// one grace PSK.
		pp.exec(`UPDATE bootstrap_psks
			SET status = 'revoked', grace_expires_at = NULL, revoked_at = $1
			WHERE status = 'grace'`, []any{now}, wrapped(op+": revoke grace"))
		if grace > 0 {
			pp.exec(`UPDATE bootstrap_psks
				SET status = 'grace', grace_expires_at = $1 WHERE id = $2`, []any{now + grace.Microseconds(), fromID}, wrapped(op+": retire active"))
		} else {
			pp.exec(`UPDATE bootstrap_psks
				SET status = 'revoked', revoked_at = $1 WHERE id = $2`, []any{now, fromID}, wrapped(op+": retire active"))
		}
		created := timeArg(p.CreatedAt)
		if created == nil {
			created = now
		}
		pp.exec(`INSERT INTO bootstrap_psks (`+pskColumns+`)
			VALUES ($1, $2, $3, 'active', $4, NULL, NULL)`, []any{p.ID, p.Ciphertext, p.Nonce, created}, wrapped(op+": insert"))
		pp.row(`SELECT `+pskColumns+` FROM bootstrap_psks WHERE id = $1`, []any{fromID}, func(row pgx.Row) error {
			var err error
			if old, err = scanPSK(row); err != nil {
				return wrap(op+": read back", err)
			}
			return nil
		})
		return commitAudited(ctx, pp, audit, op)
	})
	if err != nil {
		return store.PSK{}, err
	}
	return old, nil
}

// RevokeExpiredGracePSKs revokes the grace PSKs whose grace has ended by
// the store clock and returns their IDs in ascending order, with their
// audit record in the same transaction when there are any. It is one
// UPDATE: a row a concurrent rotation revoked first is no longer grace when
// PostgreSQL re-checks it, so no PSK is revoked twice.
func (s *Store) RevokeExpiredGracePSKs(ctx context.Context, audit func([]string) func(store.AuditHead) (store.AuditRecord, error)) ([]string, error) {
	if audit == nil {
		return nil, fmt.Errorf("postgres: revoke expired grace psks: no audit record: a psk is never revoked unaudited")
	}
	// A cleaner: what expired since it last ran may be many rows, so it
	// is bounded by longRequestTimeout, not the store's request timeout.
	ctx = long(ctx)
	const op = "revoke expired grace psks"
	return s.sweepAudited(ctx, op, `WITH revoked AS (UPDATE bootstrap_psks
			SET status = 'revoked', grace_expires_at = NULL, revoked_at = `+nowMicros+`
			WHERE status = 'grace' AND grace_expires_at <= `+nowMicros+`
			RETURNING id)
		SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM revoked`, nil,
		audit, "a psk is never revoked unaudited")
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
