-- 0003: referral tickets, a translation of the SQLite store's 0003. What a
-- discovery service keeps (authority registrations, the joins authorities
-- report, its ticket signing keys) and what an authority keeps of the
-- tickets it accepted (one row per jti, so replicas share it). Times as in
-- 0001.

-- An authority's registration: the signed document as it came, and the
-- three fields its rules need. The authority ID stays locked to the first
-- root fingerprint; versions only go up (PutRegistration).
CREATE TABLE discovery_registrations (
	authority_id     TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	root_fingerprint TEXT COLLATE "C" NOT NULL,
	version          BIGINT NOT NULL,
	document         BYTEA  NOT NULL,
	signature        BYTEA  NOT NULL,
	registered_at    BIGINT NOT NULL,
	updated_at       BIGINT NOT NULL
);

-- Joins reported by authorities. The unique key makes a replayed report
-- count once; the index serves the quota count over a recent window.
CREATE TABLE discovery_join_reports (
	authority_id TEXT COLLATE "C" NOT NULL,
	report_id    TEXT COLLATE "C" NOT NULL,
	node_id      TEXT   NOT NULL,
	ticket_id    TEXT   NOT NULL,
	joined_at    BIGINT,
	reported_at  BIGINT NOT NULL,
	PRIMARY KEY (authority_id, report_id)
);

CREATE INDEX discovery_join_reports_recent ON discovery_join_reports (authority_id, reported_at);
CREATE INDEX discovery_join_reports_reported_at ON discovery_join_reports (reported_at);

-- Discovery's referral-ticket signing keys, the private key sealed. A
-- retired key stays published until publish_until.
CREATE TABLE ticket_keys (
	id            TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	public_key    BYTEA  NOT NULL,
	ciphertext    BYTEA  NOT NULL,
	nonce         BYTEA  NOT NULL,
	status        TEXT   NOT NULL CHECK (status IN ('active', 'retired')),
	created_at    BIGINT NOT NULL,
	retired_at    BIGINT,
	publish_until BIGINT,
	CHECK ((status = 'active') = (retired_at IS NULL AND publish_until IS NULL))
);

-- At most one active ticket key, enforced by the database.
CREATE UNIQUE INDEX ticket_keys_one_active ON ticket_keys (status) WHERE status = 'active';

-- The authority's record of each referral ticket it accepted: the primary
-- key is the single use of a jti. node_id is the node the join admitted.
CREATE TABLE ticket_uses (
	jti        TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	node_id    TEXT   NOT NULL,
	keep_until BIGINT NOT NULL,
	used_at    BIGINT NOT NULL
);

CREATE INDEX ticket_uses_keep_until ON ticket_uses (keep_until);
