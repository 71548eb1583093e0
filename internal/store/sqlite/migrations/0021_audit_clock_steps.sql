-- 0021 (audit_clock_steps): the records whose time is earlier than the
-- record before them's: the wall clock of the process that appended them
-- stepped back (NTP, an operator, a restored VM). Between two such steps
-- record times never go backwards along the chain (each is read while the
-- append holds the chain), so ListAudit turns a time bound into a seq
-- bound by a binary search on seq within each run, instead of walking the
-- chain from record 1. Usually empty; appendAudit adds a row when it
-- appends such a record. The chain is append-only, so this table is too.
CREATE TABLE audit_clock_steps (
	seq INTEGER NOT NULL PRIMARY KEY
) STRICT;

INSERT INTO audit_clock_steps (seq)
	SELECT seq FROM (
		SELECT seq, time, lag(time) OVER (ORDER BY seq) AS prev FROM audit_records
	) WHERE time < prev;

CREATE TRIGGER audit_clock_steps_no_update BEFORE UPDATE ON audit_clock_steps
BEGIN
	SELECT RAISE(ABORT, 'audit clock steps are append-only');
END;

CREATE TRIGGER audit_clock_steps_no_delete BEFORE DELETE ON audit_clock_steps
BEGIN
	SELECT RAISE(ABORT, 'audit clock steps are append-only');
END;
