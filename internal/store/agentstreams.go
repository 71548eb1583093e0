package store

import (
	"context"
	"time"
)

// AgentStream is what the authority last knew of an agent's stream.
type AgentStream struct {
	NodeID      string
	Replica     string // the advertised address of the replica holding it
	Connected   bool
	ConnectedAt time.Time
	LastSeen    time.Time
	Report      string // the last heartbeat, JSON
}

// AgentStreamStore records agents' streams. Safe for concurrent use.
type AgentStreamStore interface {
	// RecordAgentStream writes the stream row of s.NodeID, replacing any.
	RecordAgentStream(ctx context.Context, s AgentStream) error
	// CloseAgentStream marks the stream opened at connectedAt closed, last
	// seen at lastSeen. A row written since by a newer stream (the agent
	// reconnected, perhaps to another replica) is left alone; so is a
	// missing row.
	CloseAgentStream(ctx context.Context, nodeID string, connectedAt, lastSeen time.Time) error
	// GetAgentStream returns a node's stream row; ErrNotFound if the agent
	// never connected.
	GetAgentStream(ctx context.Context, nodeID string) (AgentStream, error)
}
