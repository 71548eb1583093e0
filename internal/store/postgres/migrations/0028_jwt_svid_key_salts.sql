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
-- A replica of the release before this one, still running during a
-- rolling upgrade, rotates without moving the salts, and signs with the
-- new version's key derived from the version alone (and publishes the
-- next one's so): its rotation leaves the next salt as it was, which no
-- rotation of this release does. The row is made to say what it signs
-- with: no salt for the new version nor the next, the previous keeping
-- the one it had.
CREATE FUNCTION jwt_svid_key_unsalted_rotation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.version <> OLD.version AND NEW.next_salt IS NOT DISTINCT FROM OLD.next_salt THEN
		NEW.prev_salt := OLD.salt;
		NEW.salt := NULL;
		NEW.next_salt := NULL;
	END IF;
	RETURN NEW;
END
$$;

CREATE TRIGGER jwt_svid_key_unsalted_rotation BEFORE UPDATE ON jwt_svid_key
	FOR EACH ROW EXECUTE FUNCTION jwt_svid_key_unsalted_rotation();
