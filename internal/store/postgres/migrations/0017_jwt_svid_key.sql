-- 0016 (jwt_svid_key): the version of the JWT-SVID signing key
-- (docs/workload-api.md). The keys are derived from the storage key by
-- version; this one row, id 1, says which version every replica signs
-- with and since when (unix microseconds). A rotation is one conditional
-- write on version. Version 1 starts now.
CREATE TABLE jwt_svid_key (
	id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
	version    BIGINT NOT NULL CHECK (version >= 1),
	rotated_at BIGINT NOT NULL
);
INSERT INTO jwt_svid_key (id, version, rotated_at) VALUES (1, 1, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint);
