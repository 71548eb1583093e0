package sqlite

import (
	"context"
	"database/sql"

	"github.com/muster-dev/muster/internal/store"
)

// agentQuery reads agents (a page, or one) in one statement: each node with
// its current instance, the expiry of the instance's last certificate, the
// first lock in force on the node, the instance or its token (FindAnyLock's
// order, one look-up through the (kind, target) index per target), and
// the stream row. A bound-keypair agent's state is read after (its row
// goes with its token: ON DELETE CASCADE).
const agentQuery = `SELECT n.id, n.join_method, n.token_id, n.instance_id, n.created_at, n.updated_at,
	i.node_id, i.join_method, i.token_id, i.previous_id, i.state, i.generation, i.created_at, i.last_serial, i.last_public_key, i.last_issued_at,
	c.not_after,
	l.id, l.kind, l.target, l.reason, l.created_by, l.created_at, l.expires_at,
	s.node_id, s.replica, s.connected, s.connected_at, s.last_seen, s.report
	FROM nodes n
	JOIN instances i ON i.id = n.instance_id
	LEFT JOIN certificates c ON c.serial = i.last_serial
	LEFT JOIN locks l ON l.id = (SELECT x.id FROM locks x
		WHERE ((x.kind = '` + store.LockNode + `' AND x.target = n.id) OR (x.kind = '` + store.LockInstance + `' AND x.target = i.id)
			OR (x.kind = '` + store.LockToken + `' AND i.token_id <> '' AND x.target = i.token_id))
		AND (x.expires_at IS NULL OR x.expires_at > ` + nowMicros + `)
		ORDER BY CASE x.kind WHEN '` + store.LockNode + `' THEN 0 WHEN '` + store.LockInstance + `' THEN 1 ELSE 2 END, x.created_at, x.id LIMIT 1)
	LEFT JOIN agent_streams s ON s.node_id = n.id
`

// ListAgentsPage reads a page of agents in one query, and the page's
// bound-keypair state in one more when it has any.
func (s *SQLite) ListAgentsPage(ctx context.Context, afterID string, limit int) ([]store.AgentRow, error) {
	return s.agents(ctx, agentQuery+` WHERE n.id > ? ORDER BY n.id LIMIT ?`, afterID, limit)
}

// GetAgentRow reads one agent as ListAgentsPage does; ErrNotFound.
func (s *SQLite) GetAgentRow(ctx context.Context, nodeID string) (store.AgentRow, error) {
	rows, err := s.agents(ctx, agentQuery+` WHERE n.id = ?`, nodeID)
	if err == nil && len(rows) == 0 {
		err = wrap("get agent "+nodeID, sql.ErrNoRows)
	}
	if err != nil {
		return store.AgentRow{}, err
	}
	return rows[0], nil
}

func (s *SQLite) agents(ctx context.Context, query string, args ...any) ([]store.AgentRow, error) {
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap("list agents", err)
	}
	out, err := collect(rows, "list agents", scanAgentRow)
	bound := store.BoundKeypairTokenIDs(out)
	if err != nil || len(bound) == 0 {
		return out, err
	}
	byID, err := boundKeypairsOf(ctx, s.r, bound)
	if err != nil {
		return nil, wrap("list agents: bound keypairs", err)
	}
	store.AttachBoundKeypairs(out, byID)
	return out, nil
}

// scanAgentRow scans one row of agentQuery.
func scanAgentRow(r scanner) (store.AgentRow, error) {
	var (
		a                                             store.AgentRow
		nCreated, nUpdated, iCreated, iIssued, expiry sql.NullInt64
		lID, lKind, lTarget, lReason, lBy             sql.NullString
		lCreated, lExpires                            sql.NullInt64
		sNode, sReplica, sReport                      sql.NullString
		sConnected, sSince, sSeen                     sql.NullInt64
	)
	n, in := &a.Node, &a.Instance
	err := r.Scan(&n.ID, &n.JoinMethod, &n.TokenID, &n.InstanceID, &nCreated, &nUpdated,
		&in.NodeID, &in.JoinMethod, &in.TokenID, &in.PreviousID, &in.State, &in.Generation, &iCreated, &in.LastSerial, &in.LastPublicKey, &iIssued,
		&expiry,
		&lID, &lKind, &lTarget, &lReason, &lBy, &lCreated, &lExpires,
		&sNode, &sReplica, &sConnected, &sSince, &sSeen, &sReport)
	if err != nil {
		return store.AgentRow{}, err
	}
	in.ID = n.InstanceID
	n.CreatedAt, n.UpdatedAt = timeCol(nCreated), timeCol(nUpdated)
	in.CreatedAt, in.LastIssuedAt, a.NotAfter = timeCol(iCreated), timeCol(iIssued), timeCol(expiry)
	if lID.Valid {
		a.Lock = &store.Lock{ID: lID.String, Kind: lKind.String, Target: lTarget.String, Reason: lReason.String, CreatedBy: lBy.String,
			CreatedAt: timeCol(lCreated), ExpiresAt: timeCol(lExpires)}
	}
	if sNode.Valid {
		a.Stream = &store.AgentStream{NodeID: sNode.String, Replica: sReplica.String, Connected: sConnected.Int64 == 1,
			ConnectedAt: timeCol(sSince), LastSeen: timeCol(sSeen), Report: sReport.String}
	}
	return a, nil
}
