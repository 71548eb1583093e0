-- 0019 (token_uses): nothing here. The PostgreSQL store counts the uses
-- of a token of unlimited uses in a table of their own from this version
-- on, so that joins on one token do not wait for each other's commits on
-- the token's row; SQLite has one writer, which every join waits for
-- anyway, so it keeps counting every token's uses in tokens.uses_count.
-- The version is kept in step with the PostgreSQL store's.
SELECT 1;
