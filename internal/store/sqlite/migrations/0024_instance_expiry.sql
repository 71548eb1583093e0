-- 0024 (instance expiry): each instance keeps the not-after of its latest
-- certificate, and when that certificate enters the last quarter of its
-- lifetime counted from its issue (store.ExpiringAt: an agent renews at
-- about half of it, so one still holding it then has missed renewing for
-- a quarter of it), so that the authority counts the nodes whose
-- certificates are expiring or expired (muster_agent_certificates) by
-- ranges of two partial indexes over the current instances, rather than
-- a join of every node's certificate. Unix microseconds, like every
-- time; filled in from the certificates held.
ALTER TABLE instances ADD COLUMN last_not_after INTEGER;
ALTER TABLE instances ADD COLUMN last_expiring_at INTEGER;

UPDATE instances SET (last_not_after, last_expiring_at) =
	(SELECT c.not_after, c.not_after - (c.not_after - c.issued_at) / 4 FROM certificates c WHERE c.serial = instances.last_serial);

CREATE INDEX instances_current_not_after ON instances (last_not_after) WHERE state = 'current';
CREATE INDEX instances_current_expiring_at ON instances (last_expiring_at) WHERE state = 'current';
