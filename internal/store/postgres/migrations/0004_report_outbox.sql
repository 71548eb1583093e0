-- 0004: the authority's outbox of join reports, a translation of the SQLite
-- store's 0004. A join that used a referral ticket writes its report here
-- in the join's transaction; the leader delivers it to discovery
-- (ReportJoin) and deletes it once discovery has answered, so a crash or a
-- restart loses no report. Times as in 0001.
CREATE TABLE pending_reports (
	instance_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	node_id     TEXT   NOT NULL,
	ticket_id   TEXT   NOT NULL,
	joined_at   BIGINT NOT NULL,
	created_at  BIGINT NOT NULL
);

-- Delivery reads the oldest first.
CREATE INDEX pending_reports_created_at ON pending_reports (created_at, instance_id);
