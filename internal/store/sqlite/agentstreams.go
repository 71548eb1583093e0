package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// RecordAgentStream upserts a node's stream row as a new stream opens, and
// announces ChangeStream for the node once it committed.
func (s *SQLite) RecordAgentStream(ctx context.Context, a store.AgentStream) error {
	connected := 0
	if a.Connected {
		connected = 1
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO agent_streams (node_id, stream_id, replica, connected, connected_at, last_seen, report)
			VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (node_id) DO UPDATE SET stream_id = excluded.stream_id, replica = excluded.replica,
				connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen,
				report = excluded.report`,
			a.NodeID, a.StreamID, a.Replica, connected, timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report)
		if err != nil {
			return wrap("record agent stream", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeStream, a.NodeID)
	return nil
}

// TakeAgentStream upserts a node's stream row conditionally on the row it
// replaces being stream prev's, and announces ChangeStream for the node
// once it committed.
func (s *SQLite) TakeAgentStream(ctx context.Context, a store.AgentStream, prev string) error {
	connected := 0
	if a.Connected {
		connected = 1
	}
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO agent_streams (node_id, stream_id, replica, connected, connected_at, last_seen, report)
			VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (node_id) DO UPDATE SET stream_id = excluded.stream_id, replica = excluded.replica,
				connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen,
				report = excluded.report
			WHERE agent_streams.stream_id = ?`,
			a.NodeID, a.StreamID, a.Replica, connected, timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report, prev)
		if err != nil {
			return wrap("take agent stream", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("take agent stream", err)
		}
		if n == 0 {
			return fmt.Errorf("sqlite: take agent stream: %s's row is no longer stream %q's: %w", a.NodeID, prev, store.ErrConflict)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.hub.announce(store.ChangeStream, a.NodeID)
	return nil
}

// RecordAgentHeartbeat updates a stream's row, conditionally on the row
// being that stream's and open.
func (s *SQLite) RecordAgentHeartbeat(ctx context.Context, a store.AgentStream) error {
	return s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `UPDATE agent_streams SET last_seen = ?, report = ?
			WHERE node_id = ? AND stream_id = ? AND connected = 1`,
			timeArg(a.LastSeen), a.Report, a.NodeID, a.StreamID)
		if err != nil {
			return wrap("record agent heartbeat", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("record agent heartbeat", err)
		}
		if n == 1 {
			return nil
		}
		var one int
		if err := tx.QueryRowContext(ctx, `SELECT 1 FROM agent_streams WHERE node_id = ?`, a.NodeID).Scan(&one); err != nil {
			return wrap("record agent heartbeat", err)
		}
		return fmt.Errorf("sqlite: record agent heartbeat: stream %s of %s replaced or ended: %w", a.StreamID, a.NodeID, store.ErrConflict)
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
	err := s.r.QueryRowContext(ctx, `SELECT node_id, stream_id, replica, connected, connected_at, last_seen, report FROM agent_streams WHERE node_id = ?`, nodeID).
		Scan(&a.NodeID, &a.StreamID, &a.Replica, &connected, &since, &lastSeen, &a.Report)
	if err != nil {
		return store.AgentStream{}, wrap("get agent stream", err)
	}
	a.Connected, a.ConnectedAt, a.LastSeen = connected == 1, timeCol(since), timeCol(lastSeen)
	return a, nil
}
