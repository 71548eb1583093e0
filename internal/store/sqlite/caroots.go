package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

const rootColumns = `version, phase, old_cert_der, old_key_ref, new_cert_der, new_key_ref, cross_new_by_old, cross_old_by_new, started_at, changed_at`

// GetRootRotation returns the root rotation (see store.CARootStore).
func (s *SQLite) GetRootRotation(ctx context.Context) (store.RootRotation, error) {
	var (
		r                store.RootRotation
		started, changed int64
	)
	err := s.r.QueryRowContext(ctx, `SELECT `+rootColumns+` FROM ca_root_rotation WHERE id = 1`).Scan(&r.Version, &r.Phase,
		&r.OldCertDER, &r.OldKeyRef, &r.NewCertDER, &r.NewKeyRef, &r.CrossNewByOld, &r.CrossOldByNew, &started, &changed)
	if errors.Is(err, sql.ErrNoRows) {
		return store.RootRotation{Phase: store.RootPhaseNone}, nil
	}
	if err != nil {
		return store.RootRotation{}, wrap("get root rotation", err)
	}
	r.StartedAt = timeCol(sql.NullInt64{Int64: started, Valid: true})
	r.ChangedAt = timeCol(sql.NullInt64{Int64: changed, Valid: true})
	return r, nil
}

// blob passes a nil slice as NULL.
func blob(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

// PutRootRotation replaces the root rotation if it is still from, version
// and time of its write (see store.CARootStore).
func (s *SQLite) PutRootRotation(ctx context.Context, from store.RootRotation, r store.RootRotation, restart bool, audit func(store.AuditHead) (store.AuditRecord, error)) error {
	if audit == nil {
		return fmt.Errorf("sqlite: put root rotation: no audit record: a root rotation is never written unaudited")
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		version := from.Version
		args := []any{version + 1, r.Phase, blob(r.OldCertDER), blob(r.OldKeyRef), blob(r.NewCertDER), blob(r.NewKeyRef),
			blob(r.CrossNewByOld), blob(r.CrossOldByNew)}
		if version == 0 {
			_, err := tx.ExecContext(ctx, `INSERT INTO ca_root_rotation (id, `+rootColumns+`) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, `+nowMicros+`, `+nowMicros+`)`, args...)
			if err != nil {
				return wrap("put root rotation", err)
			}
			return appendAuditOf(ctx, tx, "put root rotation", audit)
		}
		started := `started_at`
		if restart {
			started = nowMicros
		}
		res, err := tx.ExecContext(ctx, `UPDATE ca_root_rotation SET version = ?, phase = ?, old_cert_der = ?, old_key_ref = ?, new_cert_der = ?,
			new_key_ref = ?, cross_new_by_old = ?, cross_old_by_new = ?, started_at = `+started+`, changed_at = `+nowMicros+`
			WHERE id = 1 AND version = ? AND changed_at = ?`, append(args, version, from.ChangedAt.UnixMicro())...)
		if err != nil {
			return wrap("put root rotation", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("sqlite: put root rotation: version %d written at %s is not the stored one: %w", version, from.ChangedAt.Format(time.RFC3339Nano), store.ErrConflict)
		}
		return appendAuditOf(ctx, tx, "put root rotation", audit)
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeCA)
	return nil
}

// DiscardCACert retires a prepared CA certificate and clears its key
// reference, returning it (see store.CARootStore).
func (s *SQLite) DiscardCACert(ctx context.Context, role, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error) {
	return s.endCACert(ctx, "discard ca cert", role, serial, store.CAPrepared, audit)
}
