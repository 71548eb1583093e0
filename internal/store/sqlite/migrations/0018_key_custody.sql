-- 0018 (key_custody): the PKCS#11 token an authority moved its keys
-- into with muster ca migrate-custody (docs/hsm.md): its pkcs11: URI and
-- module path, never the PIN. One row, id 1, written once (a second
-- migration to the same token changes nothing); every replica reads it
-- at start and refuses to start without the token.
CREATE TABLE key_custody (
	id          INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
	uri         TEXT NOT NULL,
	module      TEXT NOT NULL,
	recorded_at BIGINT NOT NULL
);
