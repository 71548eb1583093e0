-- 0003: referral tickets. What a discovery service keeps (authority
-- registrations, the joins authorities report, its ticket signing keys) and
-- what an authority keeps of the tickets it accepted (one row per jti, so
-- replicas share it). Times as in 0001.

-- An authority's registration: the signed document as it came, and the
-- three fields its rules need. The authority ID stays locked to the first
-- root fingerprint; versions only go up (PutRegistration).
CREATE TABLE discovery_registrations (
	authority_id     TEXT    NOT NULL PRIMARY KEY,
	root_fingerprint TEXT    NOT NULL,
	version          INTEGER NOT NULL,
	document         BLOB    NOT NULL,
	signature        BLOB    NOT NULL,
	registered_at    INTEGER NOT NULL,
	updated_at       INTEGER NOT NULL
) STRICT;

-- Joins reported by authorities. The unique key makes a replayed report
-- count once; the index serves the quota count over a recent window.
CREATE TABLE discovery_join_reports (
	authority_id TEXT    NOT NULL,
	report_id    TEXT    NOT NULL,
	node_id      TEXT    NOT NULL,
	ticket_id    TEXT    NOT NULL,
	joined_at    INTEGER,
	reported_at  INTEGER NOT NULL,
	PRIMARY KEY (authority_id, report_id)
) STRICT;

CREATE INDEX discovery_join_reports_recent ON discovery_join_reports (authority_id, reported_at);
CREATE INDEX discovery_join_reports_reported_at ON discovery_join_reports (reported_at);

-- Discovery's referral-ticket signing keys, the private key sealed. A
-- retired key stays published until publish_until.
CREATE TABLE ticket_keys (
	id            TEXT    NOT NULL PRIMARY KEY,
	public_key    BLOB    NOT NULL,
	ciphertext    BLOB    NOT NULL,
	nonce         BLOB    NOT NULL,
	status        TEXT    NOT NULL CHECK (status IN ('active', 'retired')),
	created_at    INTEGER NOT NULL,
	retired_at    INTEGER,
	publish_until INTEGER,
	CHECK ((status = 'active') = (retired_at IS NULL AND publish_until IS NULL))
) STRICT;

-- At most one active ticket key, enforced by the database.
CREATE UNIQUE INDEX ticket_keys_one_active ON ticket_keys (status) WHERE status = 'active';

-- The authority's record of each referral ticket it accepted: the primary
-- key is the single use of a jti. node_id is the node the join admitted.
CREATE TABLE ticket_uses (
	jti        TEXT    NOT NULL PRIMARY KEY,
	node_id    TEXT    NOT NULL,
	keep_until INTEGER NOT NULL,
	used_at    INTEGER NOT NULL
) STRICT;

CREATE INDEX ticket_uses_keep_until ON ticket_uses (keep_until);
