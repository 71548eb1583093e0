-- 0007: bound-keypair resync after a restore from backup. Each resync
-- window an operator opens begins an authority epoch; a token records the
-- epoch of its last recovery and its join state documents carry it, so a
-- document from an epoch the store does not know was signed after the
-- backup, and a document of an older epoch than its token's is a second
-- holder's. The initial epoch is '' and has no row. A window is open while
-- closed_at is NULL and open_until is after the store clock; ordinal is
-- unique, so two concurrent openings cannot both begin an epoch.
ALTER TABLE bound_keypairs ADD COLUMN epoch TEXT NOT NULL DEFAULT '';

CREATE TABLE bound_keypair_epochs (
	id         TEXT    NOT NULL PRIMARY KEY,
	ordinal    INTEGER NOT NULL UNIQUE CHECK (ordinal > 0),
	opened_at  INTEGER NOT NULL,
	open_until INTEGER NOT NULL,
	closed_at  INTEGER,
	opened_by  TEXT    NOT NULL,
	closed_by  TEXT    NOT NULL DEFAULT '',
	reason     TEXT    NOT NULL
) STRICT;
