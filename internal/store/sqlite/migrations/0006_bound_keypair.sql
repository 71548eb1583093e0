-- 0005: bound-keypair tokens. A token whose join_method is bound-keypair
-- has one row here: its spec (written by people) and its status (written
-- only by the conditional claims of a join: the key binding, the
-- registration secret's use, a recovery and its sequence, a rotation).
-- Times as in 0001; public keys in the canonical authorized_keys form. The
-- registration secret is sealed like a token's (the token ID is the
-- additional data) and set to NULL by the write that uses it.
CREATE TABLE bound_keypairs (
	token_id             TEXT    NOT NULL PRIMARY KEY REFERENCES tokens (id) ON DELETE CASCADE,
	initial_public_key   TEXT    NOT NULL,
	secret_ciphertext    BLOB,
	secret_nonce         BLOB,
	must_register_before INTEGER,
	recovery_limit       INTEGER NOT NULL CHECK (recovery_limit >= 0),
	recovery_mode        TEXT    NOT NULL CHECK (recovery_mode IN ('standard', 'relaxed', 'insecure')),
	rotate_after         INTEGER,
	bound_public_key     TEXT    NOT NULL,
	bound_instance_id    TEXT    NOT NULL,
	recovery_count       INTEGER NOT NULL CHECK (recovery_count >= 0),
	recovery_sequence    INTEGER NOT NULL CHECK (recovery_sequence >= 0),
	last_recovered_at    INTEGER,
	last_rotated_at      INTEGER,
	CHECK ((secret_ciphertext IS NULL) = (secret_nonce IS NULL))
) STRICT;

-- The authority's join-state signing keys (Ed25519): the private key sealed
-- under its own purpose (muster-join-state-encryption, the key ID as
-- additional data). The newest signs; older ones stay to verify the
-- documents agents still hold.
CREATE TABLE join_state_keys (
	id         TEXT    NOT NULL PRIMARY KEY,
	public_key BLOB    NOT NULL,
	ciphertext BLOB    NOT NULL,
	nonce      BLOB    NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;
