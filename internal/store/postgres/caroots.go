package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const rootColumns = `version, phase, old_cert_der, old_key_ref, new_cert_der, new_key_ref, cross_new_by_old, cross_old_by_new, started_at, changed_at`

// GetRootRotation returns the root rotation (see store.CARootStore).
func (s *Store) GetRootRotation(ctx context.Context) (store.RootRotation, error) {
	var (
		r                store.RootRotation
		started, changed int64
	)
	err := s.pool.QueryRow(ctx, `SELECT `+rootColumns+` FROM ca_root_rotation WHERE id = 1`).Scan(&r.Version, &r.Phase,
		&r.OldCertDER, &r.OldKeyRef, &r.NewCertDER, &r.NewKeyRef, &r.CrossNewByOld, &r.CrossOldByNew, &started, &changed)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.RootRotation{Phase: store.RootPhaseNone}, nil
	}
	if err != nil {
		return store.RootRotation{}, wrap("get root rotation", err)
	}
	r.StartedAt, r.ChangedAt = timeCol(&started), timeCol(&changed)
	return r, nil
}

// PutRootRotation replaces the root rotation if its version is still
// version (see store.CARootStore): an insert that conflicts on the key, or
// an update conditional on the version, so of two writers from one
// version exactly one succeeds.
func (s *Store) PutRootRotation(ctx context.Context, version int64, r store.RootRotation, restart bool) error {
	return s.inTx(ctx, "put root rotation", func(tx pgx.Tx) error {
		args := []any{version + 1, r.Phase, r.OldCertDER, r.OldKeyRef, r.NewCertDER, r.NewKeyRef, r.CrossNewByOld, r.CrossOldByNew}
		if version == 0 {
			tag, err := tx.Exec(ctx, `INSERT INTO ca_root_rotation (id, `+rootColumns+`) VALUES (1, $1, $2, $3, $4, $5, $6, $7, $8, `+nowMicros+`, `+nowMicros+`)
				ON CONFLICT (id) DO NOTHING`, args...)
			if err != nil {
				return wrap("put root rotation", err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("postgres: put root rotation: one was written first: %w", store.ErrConflict)
			}
			return notifyTx(ctx, tx, store.ChangeCA)
		}
		started := `started_at`
		if restart {
			started = nowMicros
		}
		tag, err := tx.Exec(ctx, `UPDATE ca_root_rotation SET version = $1, phase = $2, old_cert_der = $3, old_key_ref = $4, new_cert_der = $5,
			new_key_ref = $6, cross_new_by_old = $7, cross_old_by_new = $8, started_at = `+started+`, changed_at = `+nowMicros+`
			WHERE id = 1 AND version = $9`, append(args, version)...)
		if err != nil {
			return wrap("put root rotation", err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("postgres: put root rotation: version %d is not the stored one: %w", version, store.ErrConflict)
		}
		return notifyTx(ctx, tx, store.ChangeCA)
	})
}

// DiscardCACert retires a prepared CA certificate and clears its key
// reference, returning it (see store.CARootStore).
func (s *Store) DiscardCACert(ctx context.Context, role, serial string) ([]byte, error) {
	return s.endCACert(ctx, "discard ca cert", role, serial, store.CAPrepared)
}
