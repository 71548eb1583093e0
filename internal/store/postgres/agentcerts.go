package postgres

import (
	"context"

	"github.com/muster-dev/muster/internal/store"
)

// agentCertCountQuery counts the current instances by their latest
// certificate's expiry against the store clock at the statement's start:
// now(), read once for all three counts. Not nowMicros (clock_timestamp(),
// volatile), nor a value from a CTE: the planner estimates a range
// bounded by either with a fixed third of the rows, so it read the whole
// instances table (every superseded and deleted instance and every chain
// PEM) three times per count. now() is stable, and the planner estimates
// each range from the column's statistics: the expiring and expired
// counts, a few nodes in a healthy fleet, are ranges of the partial index
// instances_current_expiry (migration 0025) on its first column, the
// expired ones the late range filtered on its second. Every expired
// certificate is late: its last quarter starts before its not-after, as
// the CA issues no leaf that ends before its issue.
const agentCertCountQuery = `SELECT
	(SELECT count(*) FROM instances WHERE state = 'current' AND last_expiring_at > ` + stmtNowMicros + `),
	(SELECT count(*) FROM instances WHERE state = 'current' AND last_expiring_at <= ` + stmtNowMicros + `),
	(SELECT count(*) FROM instances WHERE state = 'current' AND last_expiring_at <= ` + stmtNowMicros + ` AND last_not_after <= ` + stmtNowMicros + `)`

// stmtNowMicros is the store clock at the start of the transaction, a
// statement of its own here, in unix microseconds.
const stmtNowMicros = `(EXTRACT(EPOCH FROM now()) * 1000000)::bigint`

// CountAgentCertificates counts the nodes by their latest certificate's
// expiry (see store.AgentCertificateCounter), in one statement, on one
// reading of the store clock (agentCertCountQuery).
func (s *Store) CountAgentCertificates(ctx context.Context) (store.AgentCertificateCounts, error) {
	var (
		n    store.AgentCertificateCounts
		late int64 // expiring or expired
	)
	if err := s.pool.QueryRow(ctx, agentCertCountQuery).Scan(&n.Valid, &late, &n.Expired); err != nil {
		return store.AgentCertificateCounts{}, wrap("count agent certificates", err)
	}
	n.Expiring = late - n.Expired
	return n, nil
}
