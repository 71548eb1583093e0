package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/muster-dev/muster/internal/store"
)

const pendingReportColumns = `instance_id, node_id, ticket_id, joined_at, created_at`

// ListPendingReports returns up to limit pending join reports, oldest
// first (by created_at, then instance ID), from the read pool.
func (s *SQLite) ListPendingReports(ctx context.Context, limit int) ([]store.PendingReport, error) {
	if limit < 1 {
		return nil, fmt.Errorf("sqlite: list pending reports: limit %d, want at least 1", limit)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+pendingReportColumns+` FROM pending_reports
		ORDER BY created_at, instance_id LIMIT ?`, limit)
	if err != nil {
		return nil, wrap("list pending reports", err)
	}
	return collect(rows, "list pending reports", scanPendingReport)
}

// CountPendingReports returns how many join reports are pending.
func (s *SQLite) CountPendingReports(ctx context.Context) (int64, error) {
	var n int64
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM pending_reports`).Scan(&n); err != nil {
		return 0, wrap("count pending reports", err)
	}
	return n, nil
}

// DeletePendingReport drops the pending report of an instance, on the
// single writer (batch.go); ErrNotFound if there is none.
func (s *SQLite) DeletePendingReport(ctx context.Context, instanceID string) error {
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM pending_reports WHERE instance_id = ?`, instanceID)
		if err != nil {
			return wrap("delete pending report", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("delete pending report", err)
		}
		if n == 0 {
			return wrap("delete pending report "+instanceID, sql.ErrNoRows)
		}
		return nil
	})
}

// insertPendingReport writes the join's report to discovery inside
// CommitJoin's transaction, after the instance it names: created_at is the
// store clock, joined_at the instance's creation.
func insertPendingReport(ctx context.Context, tx *writeTx, in store.Instance, u *store.TicketUse) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO pending_reports (`+pendingReportColumns+`)
		VALUES (?, ?, ?, ?, `+nowMicros+`)`,
		in.ID, in.NodeID, u.ID, timeArg(in.CreatedAt)); err != nil {
		return wrap("commit join: insert pending report", err)
	}
	return nil
}

func scanPendingReport(row scanner) (store.PendingReport, error) {
	var (
		r               store.PendingReport
		joined, created sql.NullInt64
	)
	if err := row.Scan(&r.InstanceID, &r.NodeID, &r.TicketID, &joined, &created); err != nil {
		return store.PendingReport{}, err
	}
	r.JoinedAt, r.CreatedAt = timeCol(joined), timeCol(created)
	return r, nil
}
