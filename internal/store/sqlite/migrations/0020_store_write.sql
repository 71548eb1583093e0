-- 0020 (store_write): one b-tree fewer for every audit append, so for
-- every join and renewal. No query reads audit_records by time: ListAudit
-- orders by seq with a limit, and for a time bound (alone or with an
-- action or a seq bound) SQLite's planner walks the table in seq order or
-- uses audit_records_action, with or without ANALYZE's statistics; the
-- time index was written on every append and never read.
DROP INDEX audit_records_time;
