-- 0019 (token_uses): the uses of join tokens of unlimited uses
-- (uses_allowed = 0), one row per join, appended by the join's
-- transaction instead of an UPDATE of the token's row: that UPDATE held the
-- row's lock until the join committed, so every join on one such token
-- waited for the commit of the one before it (docs/performance.md, "One
-- join token, many joins"). A token's uses are its uses_count (the uses
-- taken before this migration, or carried in by InsertToken) plus its rows
-- here; its last use is the later of last_used_at and the newest row.
-- Tokens of N uses keep counting in uses_count: their limit needs the one
-- conditional UPDATE.
--
-- token_id is not a foreign key: checking one takes a KEY SHARE lock on
-- the token's row until commit, which a DELETE of the token must wait for
-- behind a queue that new joins may keep jumping (claims.go says how the
-- joins and a deletion take turns instead). The rows are deleted with
-- their token, and by InsertToken for a new token of the same ID.
CREATE TABLE token_uses (
	token_id TEXT COLLATE "C" NOT NULL,
	used_at  BIGINT NOT NULL
);

CREATE INDEX token_uses_token ON token_uses (token_id, used_at);
