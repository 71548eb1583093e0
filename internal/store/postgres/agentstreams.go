package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// streamColumns are an agent_streams row's, in streamArgs' order ($1 to
// $12).
const streamColumns = `node_id, stream_id, replica, connected, connected_at, last_seen, report, holder, turn_from, turn_to, turn_at, turn_count`

// streamUpsert writes a stream's whole row ($1 to $12) over the node's,
// if any.
const streamUpsert = `INSERT INTO agent_streams (` + streamColumns + `)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
			ON CONFLICT (node_id) DO UPDATE SET stream_id = excluded.stream_id, replica = excluded.replica,
				connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen,
				report = excluded.report, holder = excluded.holder, turn_from = excluded.turn_from, turn_to = excluded.turn_to,
				turn_at = excluded.turn_at, turn_count = excluded.turn_count`

// streamArgs are a's values for streamColumns, then the notification of
// ChangeStream for the node ($13, $14).
func streamArgs(a store.AgentStream) []any {
	connected := 0
	if a.Connected {
		connected = 1
	}
	return []any{a.NodeID, a.StreamID, a.Replica, connected, timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report,
		a.Holder, a.Turn.From, a.Turn.To, timeArg(a.Turn.At), a.Turn.Count,
		changeChannel, changePayload(store.ChangeStream, []string{a.NodeID})}
}

// RecordAgentStream upserts a node's stream row as a new stream opens, and
// queues the notification of ChangeStream in the same statement, so every
// replica hears of it when, and only if, it commits.
func (s *Store) RecordAgentStream(ctx context.Context, a store.AgentStream) error {
	_, err := s.pool.Exec(ctx, `WITH w AS (`+streamUpsert+`
			RETURNING 1)
		SELECT pg_notify($13, $14) FROM w`, streamArgs(a)...)
	if err != nil {
		return wrap("record agent stream", err)
	}
	return nil
}

// TakeAgentStream writes a node's stream row conditionally on the row it
// replaces being stream prev's, and queues the notification of
// ChangeStream in the same statement, only if it wrote. With prev "" it
// inserts the node's first row, or takes a row that names no stream
// (written before migration 0014); with another prev it only updates, so
// a row gone since it was read is not written back.
func (s *Store) TakeAgentStream(ctx context.Context, a store.AgentStream, prev string) error {
	write, args := streamUpsert+`
			WHERE agent_streams.stream_id = ''`, streamArgs(a)
	if prev != "" {
		write = `UPDATE agent_streams SET stream_id = $2, replica = $3, connected = $4, connected_at = $5,
				last_seen = $6, report = $7, holder = $8, turn_from = $9, turn_to = $10, turn_at = $11, turn_count = $12
			WHERE node_id = $1 AND stream_id = $15`
		args = append(args, prev)
	}
	rows, err := s.pool.Query(ctx, `WITH w AS (`+write+`
			RETURNING 1)
		SELECT pg_notify($13, $14) FROM w`, args...)
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

// CloseRestoredStreams marks every row marked connected closed, with its
// audit record (store.AgentStreamStore).
func (s *Store) CloseRestoredStreams(ctx context.Context, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	const op = "close restored agent streams"
	if audit == nil {
		return 0, fmt.Errorf("postgres: %s: no audit record: they are closed only by store reapply, audited", op)
	}
	var n int64
	err := s.inPipe(ctx, op, func(p *pipe) error {
		p.exec(`UPDATE agent_streams SET connected = 0 WHERE connected = 1`, nil, func(tag pgconn.CommandTag, err error) error {
			if err != nil {
				return wrap(op, err)
			}
			if n = tag.RowsAffected(); n == 0 {
				return fmt.Errorf("postgres: %s: none marked connected: %w", op, store.ErrNotFound)
			}
			return nil
		})
		return commitAudited(ctx, p, audit, op)
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// GetAgentStream returns a node's stream row.
func (s *Store) GetAgentStream(ctx context.Context, nodeID string) (store.AgentStream, error) {
	var (
		a                       store.AgentStream
		connected, turns        int64
		since, lastSeen, turnAt *int64
	)
	err := s.pool.QueryRow(ctx, `SELECT `+streamColumns+` FROM agent_streams WHERE node_id = $1`, nodeID).
		Scan(&a.NodeID, &a.StreamID, &a.Replica, &connected, &since, &lastSeen, &a.Report,
			&a.Holder, &a.Turn.From, &a.Turn.To, &turnAt, &turns)
	if err != nil {
		return store.AgentStream{}, wrap("get agent stream", err)
	}
	a.Connected, a.ConnectedAt, a.LastSeen = connected == 1, timeCol(since), timeCol(lastSeen)
	a.Turn.At, a.Turn.Count = timeCol(turnAt), int(turns)
	return a, nil
}
