-- 0022 (nodes_without_rowid): nodes becomes a WITHOUT ROWID table keyed
-- by id. A node is always found by its id (a join's and a renewal's
-- reads, the join's write), which in a rowid table is a search of the
-- primary key's index and then of the table: two B-trees to read, and
-- after each commit to read again from the file (docs/performance.md).
-- Its rows are small, so the one B-tree holds as many per page as the
-- index did. Nothing refers to nodes, and it has no other index.
CREATE TABLE nodes_new (
	id          TEXT    NOT NULL PRIMARY KEY,
	join_method TEXT    NOT NULL,
	token_id    TEXT    NOT NULL,
	instance_id TEXT    NOT NULL REFERENCES instances (id),
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

INSERT INTO nodes_new (id, join_method, token_id, instance_id, created_at, updated_at)
	SELECT id, join_method, token_id, instance_id, created_at, updated_at FROM nodes;

DROP TABLE nodes;

ALTER TABLE nodes_new RENAME TO nodes;
