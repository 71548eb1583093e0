package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

const pendingReportColumns = `instance_id, node_id, ticket_id, joined_at, created_at`

// ListPendingReports returns up to limit pending join reports, oldest
// first (by created_at, then instance ID). It sees the joins committed
// by every replica.
func (s *Store) ListPendingReports(ctx context.Context, limit int) ([]store.PendingReport, error) {
	if limit < 1 {
		return nil, fmt.Errorf("postgres: list pending reports: limit %d, want at least 1", limit)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+pendingReportColumns+` FROM pending_reports
		ORDER BY created_at, instance_id LIMIT $1`, limit)
	if err != nil {
		return nil, wrap("list pending reports", err)
	}
	return collect(rows, "list pending reports", scanPendingReport)
}

// CountPendingReports returns how many join reports are pending.
func (s *Store) CountPendingReports(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT COUNT(*) FROM pending_reports`).Scan(&n); err != nil {
		return 0, wrap("count pending reports", err)
	}
	return n, nil
}

// DeletePendingReport drops the pending report of an instance in one
// statement; ErrNotFound if there is none.
func (s *Store) DeletePendingReport(ctx context.Context, instanceID string) error {
	return execOne(ctx, s.pool, "delete pending report "+instanceID,
		`DELETE FROM pending_reports WHERE instance_id = $1`, instanceID)
}

// insertPendingReportQuery writes the join's report to discovery inside
// CommitJoin's transaction, after the instance it names: created_at is the
// store clock, joined_at the instance's creation.
const insertPendingReportQuery = `INSERT INTO pending_reports (` + pendingReportColumns + `)
	VALUES ($1, $2, $3, $4, ` + nowMicros + `)`

func pendingReportArgs(in store.Instance, u *store.TicketUse) []any {
	return []any{in.ID, in.NodeID, u.ID, timeArg(in.CreatedAt)}
}

func scanPendingReport(row pgx.Row) (store.PendingReport, error) {
	var (
		r               store.PendingReport
		joined, created *int64
	)
	if err := row.Scan(&r.InstanceID, &r.NodeID, &r.TicketID, &joined, &created); err != nil {
		return store.PendingReport{}, err
	}
	r.JoinedAt, r.CreatedAt = timeCol(joined), timeCol(created)
	return r, nil
}
