-- The verifier set's version alone does not identify its content: a store
-- restored from a backup under a running authority and stepped back up to
-- the same version holds other signers. Each step also stamps the set with
-- the store clock (microseconds), so (version, stepped_at) names one set.
-- 0: no step since this migration.
ALTER TABLE signer_set ADD COLUMN stepped_at BIGINT NOT NULL DEFAULT 0;
