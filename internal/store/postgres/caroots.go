package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// PutRootRotation replaces the root rotation if it is still from (see
// store.CARootStore), with its audit record in the same transaction: an
// insert that conflicts on the key, or an update conditional on the
// version and its write's time, so of two writers from one read exactly
// one succeeds, and none from a read of a rotation lost with a restore.
func (s *Store) PutRootRotation(ctx context.Context, from store.RootRotation, r store.RootRotation, restart bool, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	const op = "put root rotation"
	if audit == nil {
		return fmt.Errorf("postgres: %s: no audit record: a root rotation is never written unaudited", op)
	}
	return s.inPipe(ctx, op, func(p *pipe) error {
		version := from.Version
		args := []any{version + 1, r.Phase, r.OldCertDER, r.OldKeyRef, r.NewCertDER, r.NewKeyRef, r.CrossNewByOld, r.CrossOldByNew}
		written := func(tag pgconn.CommandTag, err error) error {
			switch {
			case err != nil:
				return wrap(op, err)
			case tag.RowsAffected() != 1 && version == 0:
				return fmt.Errorf("postgres: put root rotation: one was written first: %w", store.ErrConflict)
			case tag.RowsAffected() != 1:
				return fmt.Errorf("postgres: put root rotation: version %d written at %s is not the stored one: %w", version, from.ChangedAt.Format(time.RFC3339Nano), store.ErrConflict)
			}
			return nil
		}
		if version == 0 {
			p.exec(`INSERT INTO ca_root_rotation (id, `+rootColumns+`) VALUES (1, $1, $2, $3, $4, $5, $6, $7, $8, `+nowMicros+`, `+nowMicros+`)
				ON CONFLICT (id) DO NOTHING`, args, written)
		} else {
			started := `started_at`
			if restart {
				started = nowMicros
			}
			p.exec(`UPDATE ca_root_rotation SET version = $1, phase = $2, old_cert_der = $3, old_key_ref = $4, new_cert_der = $5,
				new_key_ref = $6, cross_new_by_old = $7, cross_old_by_new = $8, started_at = `+started+`, changed_at = `+nowMicros+`
				WHERE id = 1 AND version = $9 AND changed_at = $10`, append(args, version, from.ChangedAt.UnixMicro()), written)
		}
		queueNotify(p, store.ChangeCA)
		return commitAudited(ctx, p, audit, op)
	})
}

// DiscardCACert retires a prepared CA certificate and clears its key
// reference, returning it (see store.CARootStore).
func (s *Store) DiscardCACert(ctx context.Context, role, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error) {
	return s.endCACert(ctx, "discard ca cert", role, serial, store.CAPrepared, audit)
}
