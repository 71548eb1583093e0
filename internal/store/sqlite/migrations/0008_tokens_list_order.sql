-- Paged token listing walks the tokens in (created_at, id) order from a
-- key; without this index every page would sort the whole table.
CREATE INDEX tokens_list_order ON tokens (created_at, id);
