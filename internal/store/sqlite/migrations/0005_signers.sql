-- 0005: the authority's task signers (DESIGN.md "Signed tasks and the
-- signer lifecycle") and the version of the verifier set built from them.
-- Times as in 0001.
CREATE TABLE signers (
	version_id   TEXT    NOT NULL PRIMARY KEY,
	public_key   BLOB    NOT NULL,
	-- The custody's reference to the private key: sealed under the signer
	-- purpose, never the key in clear.
	key_ref      BLOB    NOT NULL,
	state        TEXT    NOT NULL CHECK (state IN ('staged', 'active', 'grace', 'retired', 'revoked')),
	published_at INTEGER NOT NULL,
	effective_at INTEGER,
	grace_until  INTEGER,
	retires_at   INTEGER,
	ended_at     INTEGER,
	previous     TEXT    NOT NULL DEFAULT ''
) STRICT;

-- At most one staged, one active and one grace signer, enforced by the
-- database.
CREATE UNIQUE INDEX signers_one_per_live_state
	ON signers (state) WHERE state IN ('staged', 'active', 'grace');

-- One row: every change set advances the version by one, conditionally on
-- the version it read, so concurrent lifecycle changes cannot both apply.
CREATE TABLE signer_set (
	id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
	version INTEGER NOT NULL
) STRICT;
INSERT INTO signer_set (id, version) VALUES (1, 0);
