-- Every verifier set the authority published, by version, as signed: an
-- agent that missed several signer steps is handed the chain of sets from
-- the version it holds, each signed by a key the one before holds as active
-- or staged (docs/signer-lifecycle.md). One row per signer step.
CREATE TABLE verifier_sets (
    version INTEGER PRIMARY KEY,
    raw BLOB NOT NULL
);
