package postgres

import (
	"context"

	"github.com/muster-dev/muster/internal/store"
)

// CountAgentCertificates counts the nodes by their latest certificate's
// expiry (see store.AgentCertificateCounter): three counts over ranges of
// the partial indexes instances_current_expiring_at and
// instances_current_not_after, in one statement, on one reading of the
// store clock.
func (s *Store) CountAgentCertificates(ctx context.Context) (store.AgentCertificateCounts, error) {
	var (
		n    store.AgentCertificateCounts
		late int64 // expiring or expired
	)
	err := s.pool.QueryRow(ctx, `WITH clock AS MATERIALIZED (SELECT `+nowMicros+` AS now) SELECT
		(SELECT count(*) FROM instances WHERE state = 'current' AND last_expiring_at > (SELECT now FROM clock)),
		(SELECT count(*) FROM instances WHERE state = 'current' AND last_expiring_at <= (SELECT now FROM clock)),
		(SELECT count(*) FROM instances WHERE state = 'current' AND last_not_after <= (SELECT now FROM clock))`).Scan(&n.Valid, &late, &n.Expired)
	if err != nil {
		return store.AgentCertificateCounts{}, wrap("count agent certificates", err)
	}
	n.Expiring = late - n.Expired
	return n, nil
}
