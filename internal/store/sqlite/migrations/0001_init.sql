-- 0001: the initial schema. Times are INTEGER unix microseconds, UTC; a NULL
-- time is the zero time.Time. Tables are STRICT so a type slip is an error,
-- not a silent coercion.

CREATE TABLE bootstrap_psks (
	id               TEXT    NOT NULL PRIMARY KEY,
	ciphertext       BLOB    NOT NULL,
	nonce            BLOB    NOT NULL,
	status           TEXT    NOT NULL CHECK (status IN ('active', 'grace', 'revoked')),
	created_at       INTEGER NOT NULL,
	grace_expires_at INTEGER,
	revoked_at       INTEGER
) STRICT;

-- At most one active and at most one grace PSK, enforced by the database:
-- the index holds one row per status value among the non-revoked keys.
CREATE UNIQUE INDEX bootstrap_psks_one_per_live_status
	ON bootstrap_psks (status) WHERE status IN ('active', 'grace');

CREATE TABLE operators (
	serial     TEXT    NOT NULL PRIMARY KEY,
	name       TEXT    NOT NULL,
	spiffe_id  TEXT    NOT NULL,
	not_before INTEGER NOT NULL,
	not_after  INTEGER NOT NULL,
	created_by TEXT    NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE locks (
	id         TEXT    NOT NULL PRIMARY KEY,
	kind       TEXT    NOT NULL,
	target     TEXT    NOT NULL,
	reason     TEXT    NOT NULL,
	created_by TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER
) STRICT;

CREATE INDEX locks_kind_target ON locks (kind, target);

-- seq is the rowid: the chain is stored in its own order.
CREATE TABLE audit_records (
	seq            INTEGER NOT NULL PRIMARY KEY CHECK (seq > 0),
	time           INTEGER NOT NULL,
	actor          TEXT    NOT NULL,
	action         TEXT    NOT NULL,
	target         TEXT    NOT NULL,
	result         TEXT    NOT NULL,
	reason         TEXT    NOT NULL,
	source         TEXT    NOT NULL,
	correlation_id TEXT    NOT NULL,
	prev_hash      BLOB,
	hash           BLOB    NOT NULL
) STRICT;

CREATE INDEX audit_records_action ON audit_records (action);
CREATE INDEX audit_records_time ON audit_records (time);

-- The chain is append-only. The hashes make tampering detectable; these
-- triggers make it take more than a stray UPDATE.
CREATE TRIGGER audit_records_no_update BEFORE UPDATE ON audit_records
BEGIN
	SELECT RAISE(ABORT, 'audit records are append-only');
END;

CREATE TRIGGER audit_records_no_delete BEFORE DELETE ON audit_records
BEGIN
	SELECT RAISE(ABORT, 'audit records are append-only');
END;

CREATE TABLE audit_checkpoints (
	seq       INTEGER NOT NULL PRIMARY KEY,
	hash      BLOB    NOT NULL,
	time      INTEGER NOT NULL,
	key_id    TEXT    NOT NULL,
	signature BLOB    NOT NULL
) STRICT;
