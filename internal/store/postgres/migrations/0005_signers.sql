-- 0005: the authority's task signers, a translation of the SQLite store's
-- 0005 (DESIGN.md "Signed tasks and the signer lifecycle") and the version
-- of the verifier set built from them. Times as in 0001.
CREATE TABLE signers (
	version_id   TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	public_key   BYTEA  NOT NULL,
	-- The custody's reference to the private key: sealed under the signer
	-- purpose, never the key in clear.
	key_ref      BYTEA  NOT NULL,
	state        TEXT   NOT NULL CHECK (state IN ('staged', 'active', 'grace', 'retired', 'revoked')),
	published_at BIGINT NOT NULL,
	effective_at BIGINT,
	grace_until  BIGINT,
	retires_at   BIGINT,
	ended_at     BIGINT,
	previous     TEXT   NOT NULL DEFAULT ''
);

-- At most one staged, one active and one grace signer, enforced by the
-- database.
CREATE UNIQUE INDEX signers_one_per_live_state
	ON signers (state) WHERE state IN ('staged', 'active', 'grace');

-- One row: every change set advances the version by one, conditionally on
-- the version it read, so concurrent lifecycle changes cannot both apply.
CREATE TABLE signer_set (
	id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
	version BIGINT  NOT NULL
);
INSERT INTO signer_set (id, version) VALUES (1, 0);

-- Signed tasks (DESIGN.md "Signed tasks"): the signed envelope once, and
-- one delivery row per target node, so a task sent through one replica
-- reaches an agent whose stream is held by another, and an offline agent
-- gets it when it reconnects (until the task expires).
CREATE TABLE tasks (
	task_id           TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	task_type         TEXT   NOT NULL,
	signer_version_id TEXT   NOT NULL,
	signed            BYTEA  NOT NULL,
	created_by        TEXT   NOT NULL,
	created_at        BIGINT NOT NULL,
	expires_at        BIGINT NOT NULL
);

CREATE TABLE task_deliveries (
	task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
	node_id    TEXT COLLATE "C" NOT NULL,
	state      TEXT   NOT NULL CHECK (state IN ('queued', 'delivered', 'ok', 'refused', 'failed')),
	detail     TEXT   NOT NULL DEFAULT '',
	updated_at BIGINT NOT NULL,
	PRIMARY KEY (node_id, task_id)
);

-- The last word of each agent's stream: which replica holds (or held) it,
-- since when, when the agent was last heard, and its last heartbeat.
CREATE TABLE agent_streams (
	node_id      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	replica      TEXT    NOT NULL,
	connected    BIGINT  NOT NULL,
	connected_at BIGINT  NOT NULL,
	last_seen    BIGINT  NOT NULL,
	report       TEXT    NOT NULL DEFAULT ''
);
