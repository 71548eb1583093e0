-- The JWT-SVID signing keys are derived from the storage key by version
-- and a salt (docs/workload-api.md): the salts of the current version's
-- key, of the previous one's and of the next one's, lowercase hex. A
-- rotation moves them along and draws the next one at random, so a
-- version reached again after a restore from an older backup gets
-- another key than it had before the restore. NULL: no salt, the key
-- derived from the version alone, as every key was before this
-- migration (the current, previous and next keys keep theirs).
ALTER TABLE jwt_svid_key ADD COLUMN prev_salt TEXT;
ALTER TABLE jwt_svid_key ADD COLUMN salt TEXT;
ALTER TABLE jwt_svid_key ADD COLUMN next_salt TEXT;
