-- 0025 (one instance expiry index): migration 0024's two partial indexes
-- over the current instances, one on last_expiring_at and one on
-- last_not_after, become one on both, which every join and renewal
-- maintains once instead of twice. The counts of
-- muster_agent_certificates are ranges of it: the valid and the late
-- ones of its first column, the expired ones of the late range filtered
-- on its second (a certificate's last quarter starts before its
-- not-after, so every expired one is late). The new index is built
-- before the old ones are dropped: on PostgreSQL the build blocks writes
-- to instances but not reads, and the drops, which block both until the
-- commit, come last.
CREATE INDEX instances_current_expiry ON instances (last_expiring_at, last_not_after) WHERE state = 'current';
DROP INDEX instances_current_not_after;
DROP INDEX instances_current_expiring_at;
