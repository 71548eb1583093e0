-- 0010: certificate revocation lists, a translation of the SQLite store's
-- 0010. One row per issuing intermediate (issuer = ROLE-SERIAL): the latest
-- signed list, its number (monotonic: PutCRL is a conditional write on the
-- number before), its times, the digest of its entries, and the DER every
-- replica serves.
CREATE TABLE crls (
	issuer      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	number      BIGINT NOT NULL CHECK (number > 0),
	this_update BIGINT NOT NULL,
	next_update BIGINT NOT NULL,
	digest      BYTEA  NOT NULL,
	der         BYTEA  NOT NULL
);

-- What ListRevokedCertificates reads without scanning the record of
-- issuance: the certificates of a locked public key, and the deleted
-- instances recent enough to hold an unexpired certificate.
CREATE INDEX certificates_public_key ON certificates (public_key);
CREATE INDEX instances_deleted_last_issued ON instances (last_issued_at) WHERE state = 'deleted';
