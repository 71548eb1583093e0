-- 0021 (audit_clock_steps): nothing changes here. SQLite's migration 0021
-- records where record times step back along the chain, so that its
-- ListAudit finds a time bound's first record by a binary search on seq;
-- PostgreSQL's ListAudit has the audit_records_time index for that. The
-- statement keeps the numbering of the two backends the same
-- (TestBackendsMirrorMigrations).
SELECT 1;
