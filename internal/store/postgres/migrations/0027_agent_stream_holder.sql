-- 0027: who holds each node's stream (its connection identity: source
-- host and certificate serial), and the node's last turn (its live
-- stream taken by one holder from another, when, and how many times in
-- a row the two took it from each other: the copy signal). Each opening
-- stream writes them with the row, in the same conditional write, so the
-- count travels from replica to replica. The release before wrote them
-- into stream_id (NAME.HOLDER) and does not write these columns: a row it
-- writes during a rolling upgrade keeps the columns of the row it
-- replaced, and is known by the dot in its stream_id. A row written
-- before this migration says nothing here: '' and no turn.
ALTER TABLE agent_streams ADD COLUMN holder TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_streams ADD COLUMN turn_from TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_streams ADD COLUMN turn_to TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_streams ADD COLUMN turn_at BIGINT;
ALTER TABLE agent_streams ADD COLUMN turn_count BIGINT NOT NULL DEFAULT 0;
