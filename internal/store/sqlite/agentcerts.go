package sqlite

import (
	"context"

	"github.com/muster-dev/muster/internal/store"
)

// agentCertCountQuery counts the current instances by their latest
// certificate's expiry, in one statement whose 'now' SQLite reads once:
// the valid and the late (expiring or expired) ones are ranges of the
// partial index instances_current_expiry (migration 0025) on its first
// column, the expired ones the late range filtered on its second. Every
// expired certificate is late: its last quarter starts before its
// not-after, as the CA issues no leaf that ends before its issue.
const agentCertCountQuery = `SELECT
	(SELECT count(*) FROM instances WHERE state = 'current' AND last_expiring_at > ` + nowMicros + `),
	(SELECT count(*) FROM instances WHERE state = 'current' AND last_expiring_at <= ` + nowMicros + `),
	(SELECT count(*) FROM instances WHERE state = 'current' AND last_expiring_at <= ` + nowMicros + ` AND last_not_after <= ` + nowMicros + `)`

// CountAgentCertificates counts the nodes by their latest certificate's
// expiry (see store.AgentCertificateCounter; agentCertCountQuery).
func (s *SQLite) CountAgentCertificates(ctx context.Context) (store.AgentCertificateCounts, error) {
	var (
		n    store.AgentCertificateCounts
		late int64 // expiring or expired
	)
	err := s.r.QueryRowContext(ctx, agentCertCountQuery).Scan(&n.Valid, &late, &n.Expired)
	if err != nil {
		return store.AgentCertificateCounts{}, wrap("count agent certificates", err)
	}
	n.Expiring = late - n.Expired
	return n, nil
}
