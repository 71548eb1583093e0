-- 0016: a retired intermediate gives up its key (DESIGN.md "CA lifecycle,
-- revocation and key custody"). key_ref becomes NULL in the same
-- conditional write that retires (or discards) the row, and only the
-- replica whose write won destroys the custody object (a PKCS#11 token's
-- key). Rows that were retired before this migration lose their sealed
-- key here; a token object of theirs stays until deleted by hand
-- (docs/hsm.md).
ALTER TABLE ca_certs ALTER COLUMN key_ref DROP NOT NULL;
UPDATE ca_certs SET key_ref = NULL WHERE state = 'retired';
ALTER TABLE ca_certs ADD CONSTRAINT ca_certs_key_until_retired CHECK (key_ref IS NOT NULL OR state = 'retired');

-- The keys of intermediates drafted for an operator who signs them with
-- an offline root key (muster ca rotate ROLE --root-key FILE) until the
-- signed certificate comes back: the prepare claims its draft (a
-- conditional delete) and the leader destroys the key of one never sent
-- back, so no token object is left behind.
CREATE TABLE ca_drafts (
	serial     TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	role       TEXT COLLATE "C" NOT NULL,
	key_ref    BYTEA  NOT NULL,
	created_at BIGINT NOT NULL
);
