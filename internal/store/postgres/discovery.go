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
func (s *Store) PutRegistration(ctx context.Context, r store.Registration, audit func(stored store.Registration) func(store.AuditHead) (store.AuditRecord, error)) (store.Registration, bool, error) {
	op := "put registration " + r.AuthorityID
	if audit == nil {
		return store.Registration{}, false, fmt.Errorf("postgres: %s: no audit record: a registration is never written unaudited", op)
	}
	var (
		stored  store.Registration
		changed bool
	)
	err := s.inPipe(ctx, op, func(p *pipe) error {
		// The clock is read once, so a new row's two times agree.
		p.row(`INSERT INTO discovery_registrations AS d
			(`+registrationColumns+`)
			SELECT $1, $2, $3, $4, $5, c.t, c.t FROM (SELECT `+nowMicros+` AS t) c
			ON CONFLICT (authority_id) DO UPDATE
			SET version = EXCLUDED.version, document = EXCLUDED.document,
				signature = EXCLUDED.signature, updated_at = `+nowMicros+`
			WHERE d.root_fingerprint = EXCLUDED.root_fingerprint AND d.version < EXCLUDED.version
			RETURNING `+registrationColumns, []any{r.AuthorityID, r.RootFingerprint, r.Version, r.Document, r.Signature}, func(row pgx.Row) error {
			var err error
			stored, err = scanRegistration(row)
			switch {
			case err == nil:
				changed = true
			case !errors.Is(err, pgx.ErrNoRows):
				return wrap("put registration", err)
			}
			return nil
		})
		if err := p.send(ctx); err != nil {
			return err
		}
		if changed {
			build := audit(stored)
			if build == nil {
				return fmt.Errorf("postgres: %s: no audit record: a registration is never written unaudited", op)
			}
			return commitAudited(ctx, p, build, op)
		}
		// Refused: the row exists, and this transaction holds its lock.
		var cur store.Registration
		p.row(`SELECT `+registrationColumns+` FROM discovery_registrations WHERE authority_id = $1`, []any{r.AuthorityID}, func(row pgx.Row) error {
			var err error
			if cur, err = scanRegistration(row); err != nil {
				return wrap("put registration", err)
			}
			return nil
		})
		if err := p.send(ctx); err != nil {
			return err
		}
		switch {
		case r.RootFingerprint != cur.RootFingerprint:
			return fmt.Errorf("postgres: put registration %s: %w", r.AuthorityID, store.ErrRootMismatch)
		case r.Version == cur.Version && bytes.Equal(r.Document, cur.Document):
			stored = cur
			return nil // a repeat: nothing written (rolled back)
		case r.Version <= cur.Version:
			return fmt.Errorf("postgres: put registration %s: version %d, registered %d: %w",
				r.AuthorityID, r.Version, cur.Version, store.ErrStaleVersion)
		}
		// Unreachable: the update's condition held.
		return fmt.Errorf("postgres: put registration %s: refused for no reason", r.AuthorityID)
	})
	if err != nil {
		return store.Registration{}, false, err
	}
	return stored, changed, nil
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
