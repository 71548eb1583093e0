-- 0022 (nodes_without_rowid): nothing changes here. SQLite's migration
-- 0022 rebuilds nodes as a WITHOUT ROWID table, one B-tree instead of a
-- table and its primary key's index; PostgreSQL has no such choice. The
-- statement keeps the numbering of the two backends the same
-- (TestBackendsMirrorMigrations).
SELECT 1;
