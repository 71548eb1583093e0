-- 0020 (store_write): nothing changes here. SQLite's migration 0020 drops
-- audit_records_time, which its planner never reads; PostgreSQL's planner
-- may use it for a ListAudit bounded by time on a long chain, so it stays.
-- The statement keeps the numbering of the two backends the same
-- (TestBackendsMirrorMigrations).
SELECT 1;
