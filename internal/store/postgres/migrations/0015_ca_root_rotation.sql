-- 0015: the root rotation (DESIGN.md "CA lifecycle, revocation and key
-- custody", "Root rotation"): one row, id 1, shared by every replica. Each
-- change is one conditional write on version. The old root's certificate
-- and key are NULL while it is the data directory's root; key references
-- are sealed by key custody under muster-ca-encryption, never a key in
-- clear. Times are unix microseconds.
CREATE TABLE ca_root_rotation (
	id               INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
	version          BIGINT NOT NULL,
	phase            TEXT COLLATE "C" NOT NULL CHECK (phase IN ('none', 'init', 'update_agents', 'update_servers', 'standby')),
	old_cert_der     BYTEA,
	old_key_ref      BYTEA,
	new_cert_der     BYTEA,
	new_key_ref      BYTEA,
	cross_new_by_old BYTEA,
	cross_old_by_new BYTEA,
	started_at       BIGINT NOT NULL,
	changed_at       BIGINT NOT NULL
);
