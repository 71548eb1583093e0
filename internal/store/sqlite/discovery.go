package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

const registrationColumns = `authority_id, root_fingerprint, version, document, signature, registered_at, updated_at`

// PutRegistration records r (see store.DiscoveryStore) as one write of
// a group-committed transaction on the single writer (batch.go): the read of the
// stored registration and the write that follows are serialized against
// every other writer of the file, so of several registrations of one
// version exactly one is stored and the others find it. RegisteredAt and
// UpdatedAt are set by the store clock; those of r are ignored.
func (s *SQLite) PutRegistration(ctx context.Context, r store.Registration, audit func(stored store.Registration) func(store.AuditHead) (store.AuditRecord, error)) (store.Registration, bool, error) {
	if audit == nil {
		return store.Registration{}, false, fmt.Errorf("sqlite: put registration %s: no audit record: a registration is never written unaudited", r.AuthorityID)
	}
	var (
		stored  store.Registration
		changed bool
	)
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var err error
		if stored, changed, err = putRegistration(ctx, tx, r); err != nil || !changed {
			return err
		}
		build := audit(stored)
		if build == nil {
			return fmt.Errorf("sqlite: put registration %s: no audit record: a registration is never written unaudited", r.AuthorityID)
		}
		return appendAuditOf(ctx, tx, "put registration "+r.AuthorityID, build)
	})
	if err != nil {
		return store.Registration{}, false, err
	}
	return stored, changed, nil
}

// putRegistration is PutRegistration's work inside the write transaction.
func putRegistration(ctx context.Context, tx *writeTx, r store.Registration) (store.Registration, bool, error) {
	cur, err := scanRegistration(tx.QueryRowContext(ctx, `SELECT `+registrationColumns+`
		FROM discovery_registrations WHERE authority_id = ?`, r.AuthorityID))
	if errors.Is(err, sql.ErrNoRows) {
		// Both times come from one evaluation of the clock: 'now' is fixed
		// for the statement.
		stored, err := scanRegistration(tx.QueryRowContext(ctx, `INSERT INTO discovery_registrations
			(`+registrationColumns+`) VALUES (?, ?, ?, ?, ?, `+nowMicros+`, `+nowMicros+`)
			RETURNING `+registrationColumns,
			r.AuthorityID, r.RootFingerprint, r.Version, r.Document, r.Signature))
		if err != nil {
			return store.Registration{}, false, wrap("put registration: insert", err)
		}
		return stored, true, nil
	}
	if err != nil {
		return store.Registration{}, false, wrap("put registration", err)
	}

	switch {
	case r.RootFingerprint != cur.RootFingerprint:
		return store.Registration{}, false, fmt.Errorf("sqlite: put registration %s: %w", r.AuthorityID, store.ErrRootMismatch)
	case r.Version == cur.Version && bytes.Equal(r.Document, cur.Document):
		return cur, false, nil // a repeat: nothing written
	case r.Version <= cur.Version:
		return store.Registration{}, false, fmt.Errorf("sqlite: put registration %s: version %d, registered %d: %w",
			r.AuthorityID, r.Version, cur.Version, store.ErrStaleVersion)
	}
	stored, err := scanRegistration(tx.QueryRowContext(ctx, `UPDATE discovery_registrations
		SET version = ?, document = ?, signature = ?, updated_at = `+nowMicros+`
		WHERE authority_id = ?
		RETURNING `+registrationColumns,
		r.Version, r.Document, r.Signature, r.AuthorityID))
	if err != nil {
		return store.Registration{}, false, wrap("put registration: update", err)
	}
	return stored, true, nil
}

// GetRegistration returns an authority's registration; ErrNotFound.
func (s *SQLite) GetRegistration(ctx context.Context, authorityID string) (store.Registration, error) {
	r, err := scanRegistration(s.r.QueryRowContext(ctx, `SELECT `+registrationColumns+`
		FROM discovery_registrations WHERE authority_id = ?`, authorityID))
	if err != nil {
		return store.Registration{}, wrap("get registration "+authorityID, err)
	}
	return r, nil
}

// DeleteRegistration drops an authority's registration, on the single
// writer, so it is ordered against every PutRegistration: a registration
// after it inserts anew. Join reports are kept. ErrNotFound if there is
// none.
func (s *SQLite) DeleteRegistration(ctx context.Context, authorityID string) error {
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM discovery_registrations WHERE authority_id = ?`, authorityID)
		if err != nil {
			return wrap("delete registration", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("delete registration", err)
		}
		if n == 0 {
			return wrap("delete registration "+authorityID, sql.ErrNoRows)
		}
		return nil
	})
}

// RecordJoinReport stores a report unless (AuthorityID, ReportID) is stored
// already, in one INSERT … ON CONFLICT DO NOTHING; inserted says which.
// ReportedAt is the store clock; r's is ignored.
func (s *SQLite) RecordJoinReport(ctx context.Context, r store.JoinReport) (bool, error) {
	var inserted bool
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO discovery_join_reports
			(authority_id, report_id, node_id, ticket_id, joined_at, reported_at)
			VALUES (?, ?, ?, ?, ?, `+nowMicros+`)
			ON CONFLICT (authority_id, report_id) DO NOTHING`,
			r.AuthorityID, r.ReportID, r.NodeID, r.TicketID, timeArg(r.JoinedAt))
		if err != nil {
			return wrap("record join report", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("record join report", err)
		}
		inserted = n == 1
		return nil
	})
	if err != nil {
		return false, err
	}
	return inserted, nil
}

// CountJoinReports counts an authority's reports recorded less than window
// before the store clock's now.
func (s *SQLite) CountJoinReports(ctx context.Context, authorityID string, window time.Duration) (int64, error) {
	var n int64
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM discovery_join_reports
		WHERE authority_id = ? AND reported_at > `+nowMicros+` - ?`,
		authorityID, window.Microseconds()).Scan(&n)
	if err != nil {
		return 0, wrap("count join reports", err)
	}
	return n, nil
}

// DeleteJoinReports drops the reports recorded more than olderThan before
// the store clock's now and returns how many. A negative olderThan reaches
// into the future: it drops every report.
func (s *SQLite) DeleteJoinReports(ctx context.Context, olderThan time.Duration) (int64, error) {
	var n int64
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM discovery_join_reports
			WHERE reported_at < `+nowMicros+` - ?`, olderThan.Microseconds())
		if err != nil {
			return wrap("delete join reports", err)
		}
		n, err = res.RowsAffected()
		if err != nil {
			return wrap("delete join reports", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

func scanRegistration(row scanner) (store.Registration, error) {
	var (
		r                   store.Registration
		registered, updated sql.NullInt64
	)
	if err := row.Scan(&r.AuthorityID, &r.RootFingerprint, &r.Version, &r.Document, &r.Signature,
		&registered, &updated); err != nil {
		return store.Registration{}, err
	}
	r.RegisteredAt, r.UpdatedAt = timeCol(registered), timeCol(updated)
	return r, nil
}
