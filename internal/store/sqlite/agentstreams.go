package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// streamColumns are an agent_streams row's, in streamArgs' order.
const streamColumns = `node_id, stream_id, replica, connected, connected_at, last_seen, report, holder, turn_from, turn_to, turn_at, turn_count`

// streamUpsert writes a stream's whole row over the node's, if any.
const streamUpsert = `INSERT INTO agent_streams (` + streamColumns + `)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (node_id) DO UPDATE SET stream_id = excluded.stream_id, replica = excluded.replica,
		connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen,
		report = excluded.report, holder = excluded.holder, turn_from = excluded.turn_from, turn_to = excluded.turn_to,
		turn_at = excluded.turn_at, turn_count = excluded.turn_count`

// streamArgs are a's values for streamColumns.
func streamArgs(a store.AgentStream) []any {
	connected := 0
	if a.Connected {
		connected = 1
	}
	return []any{a.NodeID, a.StreamID, a.Replica, connected, timeArg(a.ConnectedAt), timeArg(a.LastSeen), a.Report,
		a.Holder, a.Turn.From, a.Turn.To, timeArg(a.Turn.At), a.Turn.Count}
}

// RecordAgentStream upserts a node's stream row as a new stream opens, and
// announces ChangeStream for the node once it committed.
func (s *SQLite) RecordAgentStream(ctx context.Context, a store.AgentStream) error {
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		if _, err := tx.ExecContext(ctx, streamUpsert, streamArgs(a)...); err != nil {
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

// TakeAgentStream writes a node's stream row conditionally on the row it
// replaces being stream prev's, and announces ChangeStream for the node
// once it committed. With prev "" it inserts the node's first row, or
// takes a row that names no stream (written before migration 0014); with
// another prev it only updates, so a row gone since it was read is not
// written back.
func (s *SQLite) TakeAgentStream(ctx context.Context, a store.AgentStream, prev string) error {
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		var (
			res sql.Result
			err error
		)
		if prev == "" {
			res, err = tx.ExecContext(ctx, streamUpsert+` WHERE agent_streams.stream_id = ''`, streamArgs(a)...)
		} else {
			res, err = tx.ExecContext(ctx, `UPDATE agent_streams SET stream_id = ?, replica = ?, connected = ?, connected_at = ?,
				last_seen = ?, report = ?, holder = ?, turn_from = ?, turn_to = ?, turn_at = ?, turn_count = ?
				WHERE node_id = ? AND stream_id = ?`, append(streamArgs(a)[1:], a.NodeID, prev)...)
		}
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

// CloseRestoredStreams marks every row marked connected closed, with its
// audit record (store.AgentStreamStore).
func (s *SQLite) CloseRestoredStreams(ctx context.Context, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	const op = "close restored agent streams"
	if audit == nil {
		return 0, fmt.Errorf("sqlite: %s: no audit record: they are closed only by store reapply, audited", op)
	}
	var n int64
	err := s.write(ctx, func(ctx context.Context, tx *writeTx) error {
		res, err := tx.ExecContext(ctx, `UPDATE agent_streams SET connected = 0 WHERE connected = 1`)
		if err != nil {
			return wrap(op, err)
		}
		if n, err = res.RowsAffected(); err != nil {
			return wrap(op, err)
		}
		if n == 0 {
			return fmt.Errorf("sqlite: %s: none marked connected: %w", op, store.ErrNotFound)
		}
		return appendAuditOf(ctx, tx, op, audit)
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// GetAgentStream returns a node's stream row. Every opening stream reads
// its node's: it is read as a join's rows are (lookup, readRow), without
// a goroutine per query or an allocation per column destination.
func (s *SQLite) GetAgentStream(ctx context.Context, nodeID string) (store.AgentStream, error) {
	b, err := readRow(s.r.lookup(ctx, `SELECT `+streamColumns+` FROM agent_streams WHERE node_id = ?`, nodeID), streamColumnCount)
	if err != nil {
		return store.AgentStream{}, wrap("get agent stream", err)
	}
	defer b.put()
	a, err := agentStreamFrom(b.cols(streamColumnCount))
	if err != nil {
		return store.AgentStream{}, wrap("get agent stream", err)
	}
	return a, nil
}

var streamColumnCount = columnCount(streamColumns)

// agentStreamFrom takes streamColumns in their order.
func agentStreamFrom(c cols) (store.AgentStream, error) {
	a := store.AgentStream{NodeID: c.str(), StreamID: c.str(), Replica: c.str(), Connected: c.int() == 1,
		ConnectedAt: c.time(), LastSeen: c.time(), Report: c.str(), Holder: c.str(),
		Turn: store.StreamTurn{From: c.str(), To: c.str(), At: c.time(), Count: int(c.int())}}
	return a, c.done()
}
