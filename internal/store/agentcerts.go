package store

import (
	"context"
	"time"
)

// ExpiringAt is when c enters the last quarter of its lifetime, counted
// from its issue (its NotBefore is backdated for clock skew, by a minute:
// most of a short certificate's life). An agent renews at about half of
// it (±10%), so one still holding c then has failed to renew for a
// quarter of it: 6 h of a 24 h certificate, 15 min of a bound-keypair
// agent's 1 h one. Kept with each instance's latest certificate
// (AgentCertificateCounter).
func ExpiringAt(c Certificate) time.Time {
	from := c.IssuedAt
	if from.IsZero() {
		from = c.NotBefore
	}
	return c.NotAfter.Add(-c.NotAfter.Sub(from) / 4)
}

// AgentCertificateCounts counts the nodes (current instances: a deleted
// node's and a superseded instance's certificates are nobody's concern)
// by their latest certificate, by the store clock.
type AgentCertificateCounts struct {
	// Valid: before ExpiringAt.
	Valid int64
	// Expiring: from ExpiringAt until its not-after.
	Expiring int64
	// Expired: at or past its not-after.
	Expired int64
}

// AgentCertificateCounter counts nodes by their certificates' expiry.
// Safe for concurrent use.
type AgentCertificateCounter interface {
	// CountAgentCertificates returns the counts in one read: the expiring
	// and expired ones ranges of indexes over the current instances, the
	// valid ones a count of nearly every current instance.
	CountAgentCertificates(ctx context.Context) (AgentCertificateCounts, error)
}
