-- Each kept verifier set carries the step time (signer_set.stepped_at) of
-- the set ID it was signed at, so a set kept at the store's version by a
-- step made before a restore is told from one made after it (the version
-- alone repeats: a restore rolls it back and the next steps reach it
-- again). NULL: not known (kept before this migration, at a version below
-- the store's).
ALTER TABLE verifier_sets ADD COLUMN stepped_at BIGINT;
-- The set kept at the store's version was kept for its current ID: the
-- release before this one kept sets only while the ID they were signed at
-- was the store's.
UPDATE verifier_sets SET stepped_at = s.stepped_at FROM signer_set s
    WHERE s.id = 1 AND verifier_sets.version = s.version;
-- A replica of the release before this one, still running during a
-- rolling upgrade, keeps a set without its step time: it keeps one only
-- while the store's version and step time are those it read, in the same
-- statement (reading the signer_set row FOR SHARE, or after its own step
-- or advance in the same transaction), so the step time is the one this
-- trigger reads there.
CREATE FUNCTION verifier_sets_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.stepped_at IS NULL THEN
		SELECT stepped_at INTO NEW.stepped_at FROM signer_set WHERE id = 1 AND version = NEW.version;
	END IF;
	RETURN NEW;
END
$$;

CREATE TRIGGER verifier_sets_stamp BEFORE INSERT ON verifier_sets
	FOR EACH ROW EXECUTE FUNCTION verifier_sets_stamp();
