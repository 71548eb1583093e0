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
//
// It is reckoned in whole microseconds, the times as the store keeps them
// (StoredTime), with integer division, which truncates toward zero in Go,
// PostgreSQL and SQLite alike: so it is to the microsecond what migration
// 0024 computed in SQL from the stored columns for the instances before
// it (not_after - (not_after - issued_at) / 4), and every store writes
// the one value whichever path filled it in.
func ExpiringAt(c Certificate) time.Time {
	from := c.IssuedAt
	if from.IsZero() {
		from = c.NotBefore
	}
	notAfter, issued := StoredTime(c.NotAfter).UnixMicro(), StoredTime(from).UnixMicro()
	return time.UnixMicro(notAfter - (notAfter-issued)/4).UTC()
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
