-- 0007: bound-keypair resync after a restore from backup (the SQLite
-- migration of the same number says why). Times in microseconds since the
-- Unix epoch, as in 0001.
ALTER TABLE bound_keypairs ADD COLUMN epoch TEXT COLLATE "C" NOT NULL DEFAULT '';

CREATE TABLE bound_keypair_epochs (
	id         TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	ordinal    BIGINT NOT NULL UNIQUE CHECK (ordinal > 0),
	opened_at  BIGINT NOT NULL,
	open_until BIGINT NOT NULL,
	closed_at  BIGINT,
	opened_by  TEXT   NOT NULL,
	closed_by  TEXT   NOT NULL DEFAULT '',
	reason     TEXT   NOT NULL
);
