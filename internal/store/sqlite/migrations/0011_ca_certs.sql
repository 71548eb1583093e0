-- 0010: the CA intermediates, in the store so that every replica signs
-- with the same active one and rotation needs no file copied by hand
-- (DESIGN.md "CA lifecycle, revocation and key custody"). Times are unix
-- microseconds. An authority upgraded from intermediates kept in files
-- imports them at its first start.
CREATE TABLE ca_certs (
	serial       TEXT NOT NULL PRIMARY KEY,
	role         TEXT NOT NULL CHECK (role IN ('bootstrap', 'server', 'agent', 'admin')),
	cert_der     BLOB    NOT NULL,
	-- The custody's reference to the private key: sealed under the CA
	-- purpose (muster-ca-encryption), never the key in clear.
	key_ref      BLOB    NOT NULL,
	state        TEXT    NOT NULL CHECK (state IN ('prepared', 'active', 'retiring', 'retired')),
	not_after    INTEGER NOT NULL,
	created_at   INTEGER NOT NULL,
	activated_at INTEGER,
	retiring_at  INTEGER,
	retired_at   INTEGER
);

-- At most one prepared and one active certificate per role, enforced by
-- the database, so replicas preparing or importing at once cannot both.
CREATE UNIQUE INDEX ca_certs_one_active ON ca_certs (role) WHERE state = 'active';
CREATE UNIQUE INDEX ca_certs_one_prepared ON ca_certs (role) WHERE state = 'prepared';
