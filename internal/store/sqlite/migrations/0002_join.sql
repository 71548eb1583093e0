-- 0002: admission. Join tokens, the nodes they admit, each node's instances
-- and the certificates issued to them. Times as in 0001. An absent ID is the
-- empty string, not NULL, so that equality tests need no NULL handling.
-- Labels are a JSON object of strings.

CREATE TABLE tokens (
	id           TEXT    NOT NULL PRIMARY KEY,
	join_method  TEXT    NOT NULL,
	ciphertext   BLOB    NOT NULL,
	nonce        BLOB    NOT NULL,
	-- 0: unlimited until expiry. The CHECK backs the conditional UPDATE of
	-- CommitJoin: a token can never be used more often than allowed.
	uses_allowed INTEGER NOT NULL CHECK (uses_allowed >= 0),
	uses_count   INTEGER NOT NULL CHECK (uses_count >= 0 AND (uses_allowed = 0 OR uses_count <= uses_allowed)),
	expires_at   INTEGER,
	node_id      TEXT    NOT NULL,
	description  TEXT    NOT NULL,
	labels       TEXT    NOT NULL CHECK (json_type(labels) = 'object'),
	created_by   TEXT    NOT NULL,
	created_at   INTEGER NOT NULL,
	last_used_at INTEGER
) STRICT;

CREATE INDEX tokens_expires_at ON tokens (expires_at) WHERE expires_at IS NOT NULL;

-- An instance is never deleted: it is the history of a node ID, kept after
-- the node is.
CREATE TABLE instances (
	id              TEXT    NOT NULL PRIMARY KEY,
	node_id         TEXT    NOT NULL,
	join_method     TEXT    NOT NULL,
	token_id        TEXT    NOT NULL,
	previous_id     TEXT    NOT NULL,
	state           TEXT    NOT NULL CHECK (state IN ('current', 'superseded', 'deleted')),
	generation      INTEGER NOT NULL CHECK (generation >= 0),
	created_at      INTEGER NOT NULL,
	last_serial     TEXT    NOT NULL,
	last_public_key BLOB    NOT NULL,
	last_chain_pem  BLOB,
	last_issued_at  INTEGER
) STRICT;

CREATE INDEX instances_node_id ON instances (node_id, created_at, id);

-- At most one current instance per node ID, enforced by the database: a
-- join that forgot to supersede fails instead of leaving two identities.
CREATE UNIQUE INDEX instances_one_current ON instances (node_id) WHERE state = 'current';

-- A node is the holder of a node ID; deleting it frees the ID. token_id is
-- not a foreign key: a deleted token leaves the nodes it admitted alone.
CREATE TABLE nodes (
	id          TEXT    NOT NULL PRIMARY KEY,
	join_method TEXT    NOT NULL,
	token_id    TEXT    NOT NULL,
	instance_id TEXT    NOT NULL REFERENCES instances (id),
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE certificates (
	serial      TEXT    NOT NULL PRIMARY KEY,
	node_id     TEXT    NOT NULL,
	instance_id TEXT    NOT NULL REFERENCES instances (id),
	generation  INTEGER NOT NULL CHECK (generation >= 0),
	join_method TEXT    NOT NULL,
	token_id    TEXT    NOT NULL,
	public_key  BLOB    NOT NULL,
	not_before  INTEGER NOT NULL,
	not_after   INTEGER NOT NULL,
	issued_at   INTEGER NOT NULL
) STRICT;

CREATE INDEX certificates_node_id ON certificates (node_id, issued_at, serial);
CREATE INDEX certificates_instance_id ON certificates (instance_id);
