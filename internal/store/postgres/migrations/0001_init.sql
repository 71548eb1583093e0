-- 0001: the initial schema, a translation of the SQLite store's 0001. Times
-- are BIGINT unix microseconds, UTC; a NULL time is the zero time.Time.
-- Text that is compared or ordered is COLLATE "C", so it sorts by bytes as
-- SQLite's BINARY does, whatever the cluster's locale.

CREATE TABLE bootstrap_psks (
	id               TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	ciphertext       BYTEA  NOT NULL,
	nonce            BYTEA  NOT NULL,
	status           TEXT   NOT NULL CHECK (status IN ('active', 'grace', 'revoked')),
	created_at       BIGINT NOT NULL,
	grace_expires_at BIGINT,
	revoked_at       BIGINT
);

-- At most one active and at most one grace PSK, enforced by the database:
-- the index holds one row per status value among the non-revoked keys.
CREATE UNIQUE INDEX bootstrap_psks_one_per_live_status
	ON bootstrap_psks (status) WHERE status IN ('active', 'grace');

CREATE TABLE operators (
	serial     TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	name       TEXT   NOT NULL,
	spiffe_id  TEXT   NOT NULL,
	not_before BIGINT NOT NULL,
	not_after  BIGINT NOT NULL,
	created_by TEXT   NOT NULL,
	created_at BIGINT NOT NULL
);

CREATE TABLE locks (
	id         TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	kind       TEXT COLLATE "C" NOT NULL,
	target     TEXT COLLATE "C" NOT NULL,
	reason     TEXT   NOT NULL,
	created_by TEXT   NOT NULL,
	created_at BIGINT NOT NULL,
	expires_at BIGINT
);

CREATE INDEX locks_kind_target ON locks (kind, target);

CREATE TABLE audit_records (
	seq            BIGINT NOT NULL PRIMARY KEY CHECK (seq > 0),
	time           BIGINT NOT NULL,
	actor          TEXT   NOT NULL,
	action         TEXT COLLATE "C" NOT NULL,
	target         TEXT   NOT NULL,
	result         TEXT   NOT NULL,
	reason         TEXT   NOT NULL,
	source         TEXT   NOT NULL,
	correlation_id TEXT   NOT NULL,
	prev_hash      BYTEA,
	hash           BYTEA  NOT NULL
);

CREATE INDEX audit_records_action ON audit_records (action);
CREATE INDEX audit_records_time ON audit_records (time);

-- The chain is append-only. The hashes make tampering detectable; these
-- triggers make it take more than a stray UPDATE, DELETE or TRUNCATE.
CREATE FUNCTION audit_records_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'audit records are append-only';
END
$$;

CREATE TRIGGER audit_records_no_update BEFORE UPDATE OR DELETE ON audit_records
	FOR EACH ROW EXECUTE FUNCTION audit_records_append_only();

CREATE TRIGGER audit_records_no_truncate BEFORE TRUNCATE ON audit_records
	FOR EACH STATEMENT EXECUTE FUNCTION audit_records_append_only();

CREATE TABLE audit_checkpoints (
	seq       BIGINT NOT NULL PRIMARY KEY,
	hash      BYTEA  NOT NULL,
	time      BIGINT NOT NULL,
	key_id    TEXT   NOT NULL,
	signature BYTEA  NOT NULL
);
