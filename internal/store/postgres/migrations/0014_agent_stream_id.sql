-- 0014: which stream an agent_streams row belongs to. An agent holds one
-- live stream across all replicas: the one that recorded the row last.
-- Heartbeats are recorded only by that stream (a conditional write on
-- stream_id); an older stream whose write fails, or that learns of the
-- newer one by the store's change notification, ends.
ALTER TABLE agent_streams ADD COLUMN stream_id TEXT NOT NULL DEFAULT '';
