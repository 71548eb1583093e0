-- 0013: what the certificates of a token's joins may be used for (the
-- Workload API's --svid-usage, docs/workload-api.md): client
-- authentication only, or server authentication too, so two agents can
-- mTLS each other. Existing tokens keep client only.
ALTER TABLE tokens ADD COLUMN svid_usage TEXT NOT NULL DEFAULT 'client'
	CHECK (svid_usage IN ('client', 'client,server'));
