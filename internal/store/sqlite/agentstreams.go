package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// RecordAgentStream upserts a node's stream row.
func (s *SQLite) RecordAgentStream(ctx context.Context, a store.AgentStream) error {
	connected := 0
	if a.Connected {
		connected = 1
	}
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO agent_streams (node_id, replica, connected, connected_at, last_seen, report)
			VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (node_id) DO UPDATE SET replica = excluded.replica, connected = excluded.connected,
				connected_at = excluded.connected_at, last_seen = excluded.last_seen, report = excluded.report`,
			a.NodeID, a.Replica, connected, timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report)
		if err != nil {
			return wrap("record agent stream", err)
		}
		return nil
	})
}

// CloseAgentStream marks one stream closed, conditionally on its opening
// time.
func (s *SQLite) CloseAgentStream(ctx context.Context, nodeID string, connectedAt, lastSeen time.Time) error {
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		_, err := tx.ExecContext(ctx, `UPDATE agent_streams SET connected = 0, last_seen = ? WHERE node_id = ? AND connected_at = ?`,
			timeArg(lastSeen), nodeID, timeArg(connectedAt))
		if err != nil {
			return wrap("close agent stream", err)
		}
		return nil
	})
}

// GetAgentStream returns a node's stream row.
func (s *SQLite) GetAgentStream(ctx context.Context, nodeID string) (store.AgentStream, error) {
	var (
		a               store.AgentStream
		connected       int
		since, lastSeen sql.NullInt64
	)
	err := s.r.QueryRowContext(ctx, `SELECT node_id, replica, connected, connected_at, last_seen, report FROM agent_streams WHERE node_id = ?`, nodeID).
		Scan(&a.NodeID, &a.Replica, &connected, &since, &lastSeen, &a.Report)
	if err != nil {
		return store.AgentStream{}, wrap("get agent stream", err)
	}
	a.Connected, a.ConnectedAt, a.LastSeen = connected == 1, timeCol(since), timeCol(lastSeen)
	return a, nil
}
