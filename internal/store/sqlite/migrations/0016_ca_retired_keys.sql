-- 0016: a retired intermediate gives up its key (DESIGN.md "CA lifecycle,
-- revocation and key custody"). key_ref becomes NULL in the same
-- conditional write that retires (or discards) the row, and only the
-- replica whose write won destroys the custody object (a PKCS#11 token's
-- key). Rows that were retired before this migration lose their sealed
-- key here; a token object of theirs stays until deleted by hand
-- (docs/hsm.md). SQLite cannot drop NOT NULL, so the table is rebuilt.
CREATE TABLE ca_certs_0016 (
	serial       TEXT NOT NULL PRIMARY KEY,
	role         TEXT NOT NULL CHECK (role IN ('bootstrap', 'server', 'agent', 'admin')),
	cert_der     BLOB    NOT NULL,
	-- The custody's reference to the private key: sealed under the CA
	-- purpose (muster-ca-encryption), never the key in clear. NULL once
	-- retired, and only then.
	key_ref      BLOB,
	state        TEXT    NOT NULL CHECK (state IN ('prepared', 'active', 'retiring', 'retired')),
	not_after    INTEGER NOT NULL,
	created_at   INTEGER NOT NULL,
	activated_at INTEGER,
	retiring_at  INTEGER,
	retired_at   INTEGER,
	CHECK (key_ref IS NOT NULL OR state = 'retired')
);
INSERT INTO ca_certs_0016 (serial, role, cert_der, key_ref, state, not_after, created_at, activated_at, retiring_at, retired_at)
	SELECT serial, role, cert_der, CASE WHEN state = 'retired' THEN NULL ELSE key_ref END, state, not_after, created_at, activated_at, retiring_at, retired_at
	FROM ca_certs;
DROP TABLE ca_certs;
ALTER TABLE ca_certs_0016 RENAME TO ca_certs;
CREATE UNIQUE INDEX ca_certs_one_active ON ca_certs (role) WHERE state = 'active';
CREATE UNIQUE INDEX ca_certs_one_prepared ON ca_certs (role) WHERE state = 'prepared';

-- The keys of intermediates drafted for an operator who signs them with
-- an offline root key (muster ca rotate ROLE --root-key FILE) until the
-- signed certificate comes back: the prepare claims its draft (a
-- conditional delete) and the leader destroys the key of one never sent
-- back, so no token object is left behind.
CREATE TABLE ca_drafts (
	serial     TEXT    NOT NULL PRIMARY KEY,
	role       TEXT    NOT NULL,
	key_ref    BLOB    NOT NULL,
	created_at INTEGER NOT NULL
);
