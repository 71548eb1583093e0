-- 0002: admission, a translation of the SQLite store's 0002. Join tokens,
-- the nodes they admit, each node's instances and the certificates issued to
-- them. Times as in 0001. An absent ID is the empty string, not NULL, so
-- that equality tests need no NULL handling. Labels are a JSON object of
-- strings.

CREATE TABLE tokens (
	id           TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	join_method  TEXT   NOT NULL,
	ciphertext   BYTEA  NOT NULL,
	nonce        BYTEA  NOT NULL,
	-- 0: unlimited until expiry. The CHECK backs the conditional UPDATE of
	-- CommitJoin: a token can never be used more often than allowed.
	uses_allowed BIGINT NOT NULL CHECK (uses_allowed >= 0),
	uses_count   BIGINT NOT NULL CHECK (uses_count >= 0 AND (uses_allowed = 0 OR uses_count <= uses_allowed)),
	expires_at   BIGINT,
	node_id      TEXT COLLATE "C" NOT NULL,
	description  TEXT   NOT NULL,
	labels       JSONB  NOT NULL CHECK (jsonb_typeof(labels) = 'object'),
	created_by   TEXT   NOT NULL,
	created_at   BIGINT NOT NULL,
	last_used_at BIGINT
);

CREATE INDEX tokens_expires_at ON tokens (expires_at) WHERE expires_at IS NOT NULL;

-- An instance is never deleted: it is the history of a node ID, kept after
-- the node is.
CREATE TABLE instances (
	id              TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	node_id         TEXT COLLATE "C" NOT NULL,
	join_method     TEXT   NOT NULL,
	token_id        TEXT COLLATE "C" NOT NULL,
	previous_id     TEXT COLLATE "C" NOT NULL,
	state           TEXT   NOT NULL CHECK (state IN ('current', 'superseded', 'deleted')),
	generation      BIGINT NOT NULL CHECK (generation >= 0),
	created_at      BIGINT NOT NULL,
	last_serial     TEXT COLLATE "C" NOT NULL,
	last_public_key BYTEA  NOT NULL,
	last_chain_pem  BYTEA,
	last_issued_at  BIGINT
);

CREATE INDEX instances_node_id ON instances (node_id, created_at, id);

-- At most one current instance per node ID, enforced by the database: a
-- join that forgot to supersede fails instead of leaving two identities.
CREATE UNIQUE INDEX instances_one_current ON instances (node_id) WHERE state = 'current';

-- A node is the holder of a node ID; deleting it frees the ID. token_id is
-- not a foreign key: a deleted token leaves the nodes it admitted alone.
CREATE TABLE nodes (
	id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	join_method TEXT   NOT NULL,
	token_id    TEXT COLLATE "C" NOT NULL,
	instance_id TEXT COLLATE "C" NOT NULL REFERENCES instances (id),
	created_at  BIGINT NOT NULL,
	updated_at  BIGINT NOT NULL
);

CREATE TABLE certificates (
	serial      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	node_id     TEXT COLLATE "C" NOT NULL,
	instance_id TEXT COLLATE "C" NOT NULL REFERENCES instances (id),
	generation  BIGINT NOT NULL CHECK (generation >= 0),
	join_method TEXT   NOT NULL,
	token_id    TEXT COLLATE "C" NOT NULL,
	public_key  BYTEA  NOT NULL,
	not_before  BIGINT NOT NULL,
	not_after   BIGINT NOT NULL,
	issued_at   BIGINT NOT NULL
);

CREATE INDEX certificates_node_id ON certificates (node_id, issued_at, serial);
CREATE INDEX certificates_instance_id ON certificates (instance_id);
