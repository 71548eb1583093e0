-- 0010: certificate revocation lists for relying parties. One row per
-- issuing intermediate (issuer = ROLE-SERIAL): the latest signed list, its
-- number (monotonic: PutCRL is a conditional write on the number before),
-- its times, the digest of its entries, and the DER every replica serves.
CREATE TABLE crls (
	issuer      TEXT    NOT NULL PRIMARY KEY,
	number      INTEGER NOT NULL CHECK (number > 0),
	this_update INTEGER NOT NULL,
	next_update INTEGER NOT NULL,
	digest      BLOB    NOT NULL,
	der         BLOB    NOT NULL
) STRICT;

-- What ListRevokedCertificates reads without scanning the record of
-- issuance: the certificates of a locked public key, and the deleted
-- instances recent enough to hold an unexpired certificate.
CREATE INDEX certificates_public_key ON certificates (public_key);
CREATE INDEX instances_deleted_last_issued ON instances (last_issued_at) WHERE state = 'deleted';
