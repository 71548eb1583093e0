package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// RecordAgentStream upserts a node's stream row as a new stream opens, and
// queues the notification of ChangeStream in the same statement, so every
// replica hears of it when, and only if, it commits.
func (s *Store) RecordAgentStream(ctx context.Context, a store.AgentStream) error {
	connected := 0
	if a.Connected {
		connected = 1
	}
	_, err := s.pool.Exec(ctx, `WITH w AS (
			INSERT INTO agent_streams (node_id, stream_id, replica, connected, connected_at, last_seen, report)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (node_id) DO UPDATE SET stream_id = excluded.stream_id, replica = excluded.replica,
				connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen,
				report = excluded.report
			RETURNING 1)
		SELECT pg_notify($8, $9) FROM w`,
		a.NodeID, a.StreamID, a.Replica, connected, timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report,
		changeChannel, changePayload(store.ChangeStream, []string{a.NodeID}))
	if err != nil {
		return wrap("record agent stream", err)
	}
	return nil
}

// TakeAgentStream upserts a node's stream row conditionally on the row it
// replaces being stream prev's, and queues the notification of
// ChangeStream in the same statement, only if it wrote.
func (s *Store) TakeAgentStream(ctx context.Context, a store.AgentStream, prev string) error {
	connected := 0
	if a.Connected {
		connected = 1
	}
	rows, err := s.pool.Query(ctx, `WITH w AS (
			INSERT INTO agent_streams (node_id, stream_id, replica, connected, connected_at, last_seen, report)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (node_id) DO UPDATE SET stream_id = excluded.stream_id, replica = excluded.replica,
				connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen,
				report = excluded.report
			WHERE agent_streams.stream_id = $10
			RETURNING 1)
		SELECT pg_notify($8, $9) FROM w`,
		a.NodeID, a.StreamID, a.Replica, connected, timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report,
		changeChannel, changePayload(store.ChangeStream, []string{a.NodeID}), prev)
	if err != nil {
		return wrap("take agent stream", err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return wrap("take agent stream", err)
	}
	if n == 0 {
		return fmt.Errorf("postgres: take agent stream: %s's row is no longer stream %q's: %w", a.NodeID, prev, store.ErrConflict)
	}
	return nil
}

// RecordAgentHeartbeat updates a stream's row, conditionally on the row
// being that stream's and open.
func (s *Store) RecordAgentHeartbeat(ctx context.Context, a store.AgentStream) error {
	tag, err := s.pool.Exec(ctx, `UPDATE agent_streams SET last_seen = $1, report = $2
		WHERE node_id = $3 AND stream_id = $4 AND connected = 1`,
		timeArg(a.LastSeen), a.Report, a.NodeID, a.StreamID)
	if err != nil {
		return wrap("record agent heartbeat", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var one int
	if err := s.pool.QueryRow(ctx, `SELECT 1 FROM agent_streams WHERE node_id = $1`, a.NodeID).Scan(&one); err != nil {
		return wrap("record agent heartbeat", err)
	}
	return fmt.Errorf("postgres: record agent heartbeat: stream %s of %s replaced or ended: %w", a.StreamID, a.NodeID, store.ErrConflict)
}

// CloseAgentStream marks one stream closed, conditionally on its opening
// time.
func (s *Store) CloseAgentStream(ctx context.Context, nodeID string, connectedAt, lastSeen time.Time) error {
	if _, err := s.pool.Exec(ctx, `UPDATE agent_streams SET connected = 0, last_seen = $1 WHERE node_id = $2 AND connected_at = $3`,
		timeArg(lastSeen), nodeID, timeArg(connectedAt)); err != nil {
		return wrap("close agent stream", err)
	}
	return nil
}

// GetAgentStream returns a node's stream row.
func (s *Store) GetAgentStream(ctx context.Context, nodeID string) (store.AgentStream, error) {
	var (
		a               store.AgentStream
		connected       int64
		since, lastSeen *int64
	)
	err := s.pool.QueryRow(ctx, `SELECT node_id, stream_id, replica, connected, connected_at, last_seen, report FROM agent_streams WHERE node_id = $1`, nodeID).
		Scan(&a.NodeID, &a.StreamID, &a.Replica, &connected, &since, &lastSeen, &a.Report)
	if err != nil {
		return store.AgentStream{}, wrap("get agent stream", err)
	}
	a.Connected, a.ConnectedAt, a.LastSeen = connected == 1, timeCol(since), timeCol(lastSeen)
	return a, nil
}
