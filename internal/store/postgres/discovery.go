package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const registrationColumns = `authority_id, root_fingerprint, version, document, signature, registered_at, updated_at`

// PutRegistration records r (see store.DiscoveryStore) in one READ
// COMMITTED transaction whose first statement is the conditional write:
// an INSERT … ON CONFLICT DO UPDATE that inserts a new authority ID and
// replaces a known one only if the root matches and the version goes up.
// Concurrent registrations of one new ID queue on the primary key, and
// PostgreSQL locks the conflicting row whether or not it is updated, so
// the read that explains a refusal sees the row as it stands until
// commit: of several registrations of one version exactly one is stored.
// RegisteredAt and UpdatedAt are set by the store clock; those of r are
// ignored.
func (s *Store) PutRegistration(ctx context.Context, r store.Registration) (store.Registration, bool, error) {
	var (
		stored  store.Registration
		changed bool
	)
	err := s.inTx(ctx, "put registration", func(tx pgx.Tx) error {
		var err error
		stored, changed, err = putRegistration(ctx, tx, r)
		return err
	})
	if err != nil {
		return store.Registration{}, false, err
	}
	return stored, changed, nil
}

// putRegistration is PutRegistration's work inside the transaction.
func putRegistration(ctx context.Context, tx pgx.Tx, r store.Registration) (store.Registration, bool, error) {
	// The clock is read once, so a new row's two times agree.
	stored, err := scanRegistration(tx.QueryRow(ctx, `INSERT INTO discovery_registrations AS d
		(`+registrationColumns+`)
		SELECT $1, $2, $3, $4, $5, c.t, c.t FROM (SELECT `+nowMicros+` AS t) c
		ON CONFLICT (authority_id) DO UPDATE
		SET version = EXCLUDED.version, document = EXCLUDED.document,
			signature = EXCLUDED.signature, updated_at = `+nowMicros+`
		WHERE d.root_fingerprint = EXCLUDED.root_fingerprint AND d.version < EXCLUDED.version
		RETURNING `+registrationColumns,
		r.AuthorityID, r.RootFingerprint, r.Version, r.Document, r.Signature))
	if err == nil {
		return stored, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return store.Registration{}, false, wrap("put registration", err)
	}

	// Refused: the row exists, and this transaction holds its lock.
	cur, err := scanRegistration(tx.QueryRow(ctx, `SELECT `+registrationColumns+`
		FROM discovery_registrations WHERE authority_id = $1`, r.AuthorityID))
	if err != nil {
		return store.Registration{}, false, wrap("put registration", err)
	}
	switch {
	case r.RootFingerprint != cur.RootFingerprint:
		return store.Registration{}, false, fmt.Errorf("postgres: put registration %s: %w", r.AuthorityID, store.ErrRootMismatch)
	case r.Version == cur.Version && bytes.Equal(r.Document, cur.Document):
		return cur, false, nil // a repeat: nothing written
	case r.Version <= cur.Version:
		return store.Registration{}, false, fmt.Errorf("postgres: put registration %s: version %d, registered %d: %w",
			r.AuthorityID, r.Version, cur.Version, store.ErrStaleVersion)
	}
	// Unreachable: the update's condition held.
	return store.Registration{}, false, fmt.Errorf("postgres: put registration %s: refused for no reason", r.AuthorityID)
}

// GetRegistration returns an authority's registration; ErrNotFound.
func (s *Store) GetRegistration(ctx context.Context, authorityID string) (store.Registration, error) {
	r, err := scanRegistration(s.pool.QueryRow(ctx, `SELECT `+registrationColumns+`
		FROM discovery_registrations WHERE authority_id = $1`, authorityID))
	if err != nil {
		return store.Registration{}, wrap("get registration "+authorityID, err)
	}
	return r, nil
}

// DeleteRegistration drops an authority's registration in one statement;
// a concurrent PutRegistration of the ID either finds the row (and waits
// for its lock) or inserts anew after the delete commits. Join reports are
// kept. ErrNotFound if there is none.
func (s *Store) DeleteRegistration(ctx context.Context, authorityID string) error {
	return execOne(ctx, s.pool, "delete registration "+authorityID,
		`DELETE FROM discovery_registrations WHERE authority_id = $1`, authorityID)
}

// RecordJoinReport stores a report unless (AuthorityID, ReportID) is stored
// already, in one INSERT … ON CONFLICT DO NOTHING: a concurrent insert of
// the same key waits for the first and then does nothing. inserted says
// which. ReportedAt is the store clock; r's is ignored.
func (s *Store) RecordJoinReport(ctx context.Context, r store.JoinReport) (bool, error) {
	tag, err := s.pool.Exec(ctx, `INSERT INTO discovery_join_reports
		(authority_id, report_id, node_id, ticket_id, joined_at, reported_at)
		VALUES ($1, $2, $3, $4, $5, `+nowMicros+`)
		ON CONFLICT (authority_id, report_id) DO NOTHING`,
		r.AuthorityID, r.ReportID, r.NodeID, r.TicketID, timeArg(r.JoinedAt))
	if err != nil {
		return false, wrap("record join report", err)
	}
	return tag.RowsAffected() == 1, nil
}

// CountJoinReports counts an authority's reports recorded less than window
// before the store clock's now.
func (s *Store) CountJoinReports(ctx context.Context, authorityID string, window time.Duration) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT COUNT(*) FROM discovery_join_reports
		WHERE authority_id = $1 AND reported_at > `+nowMicros+` - $2`,
		authorityID, window.Microseconds()).Scan(&n)
	if err != nil {
		return 0, wrap("count join reports", err)
	}
	return n, nil
}

// DeleteJoinReports drops the reports recorded more than olderThan before
// the store clock's now and returns how many. A negative olderThan reaches
// into the future: it drops every report.
func (s *Store) DeleteJoinReports(ctx context.Context, olderThan time.Duration) (int64, error) {
	// A cleaner: what expired since it last ran may be many rows, so it
	// is bounded by longRequestTimeout, not the store's request timeout.
	ctx = long(ctx)
	tag, err := s.pool.Exec(ctx, `DELETE FROM discovery_join_reports
		WHERE reported_at < `+nowMicros+` - $1`, olderThan.Microseconds())
	if err != nil {
		return 0, wrap("delete join reports", err)
	}
	return tag.RowsAffected(), nil
}

func scanRegistration(row pgx.Row) (store.Registration, error) {
	var (
		r                   store.Registration
		registered, updated *int64
	)
	if err := row.Scan(&r.AuthorityID, &r.RootFingerprint, &r.Version, &r.Document, &r.Signature,
		&registered, &updated); err != nil {
		return store.Registration{}, err
	}
	r.RegisteredAt, r.UpdatedAt = timeCol(registered), timeCol(updated)
	return r, nil
}
