-- Each kept verifier set carries the step time (signer_set.stepped_at) of
-- the set ID it was signed at, so a set kept at the store's version by a
-- step made before a restore is told from one made after it (the version
-- alone repeats: a restore rolls it back and the next steps reach it
-- again). NULL: not known (kept before this migration, at a version below
-- the store's).
ALTER TABLE verifier_sets ADD COLUMN stepped_at INTEGER;
-- The set kept at the store's version was kept for its current ID: the
-- release before this one kept sets only while the ID they were signed at
-- was the store's.
UPDATE verifier_sets SET stepped_at = (SELECT stepped_at FROM signer_set WHERE id = 1)
    WHERE version = (SELECT version FROM signer_set WHERE id = 1);
-- A replica of the release before this one, still running during an
-- upgrade, keeps a set without its step time: it keeps one only while the
-- store's version and step time are those it read, in the same write, so
-- the row's version is the store's and its step time the store's too.
CREATE TRIGGER verifier_sets_stamp AFTER INSERT ON verifier_sets
    WHEN NEW.stepped_at IS NULL
BEGIN
    UPDATE verifier_sets SET stepped_at = (SELECT stepped_at FROM signer_set WHERE id = 1 AND version = NEW.version)
        WHERE version = NEW.version;
END;
