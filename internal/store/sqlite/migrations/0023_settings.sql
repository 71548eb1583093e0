-- 0023 (settings): the settings every authority replica on the store
-- shares, kept once here rather than in each replica's authority.yaml
-- (docs/high-availability.md, "Settings kept in the store"): one row a
-- key, its canonical text, and a version that every write checks and
-- advances, so a first value recorded by replicas starting together, and
-- changes made through several replicas at once, are each one
-- conditional write. Times are unix microseconds of the store clock.
CREATE TABLE settings (
	key        TEXT    NOT NULL PRIMARY KEY,
	value      TEXT    NOT NULL,
	version    INTEGER NOT NULL CHECK (version >= 1),
	updated_at INTEGER NOT NULL,
	updated_by TEXT    NOT NULL
) STRICT;
