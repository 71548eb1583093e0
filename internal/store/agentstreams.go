package store

import (
	"context"
	"time"
)

// AgentStream is what the authority last knew of an agent's stream.
type AgentStream struct {
	NodeID string
	// StreamID names one stream (random, chosen as it opens): the row
	// belongs to the stream that recorded it last, and only that stream
	// records heartbeats in it. The release before migration 0027 wrote
	// NAME.HOLDER here (its Holder and Turn encoded after a dot), and
	// left the holder and turn columns as the row's writer before it
	// left them: in such a row, written during a rolling upgrade, Holder
	// and Turn are not its stream's.
	StreamID    string
	Replica     string // the advertised address of the replica holding it
	Connected   bool
	ConnectedAt time.Time
	LastSeen    time.Time
	Report      string // the last heartbeat, JSON
	// Holder is the stream's connection identity (the agent's source
	// host and certificate serial), which tells two holders of one
	// agent identity apart; "" if the row does not say (written before
	// migration 0027).
	Holder string
	// Turn is the node's last turn: its live stream taken by one holder
	// from another. Each opening stream carries it over from the row it
	// replaces, or writes its own, in the same write, so the count
	// travels with the node's row from replica to replica.
	Turn StreamTurn
}

// StreamTurn is a node's live stream taken by the holder To from the
// holder From, at At (the store's clock), the Count-th time in a row
// that the two took it from each other (two holders of one identity
// take turns: a copy of the agent). The zero value: none recorded.
type StreamTurn struct {
	From, To string
	At       time.Time
	Count    int
}

// AgentStreamStore records agents' streams. An agent holds one live stream
// across all replicas: the one whose row it is. Safe for concurrent use.
type AgentStreamStore interface {
	// RecordAgentStream writes the stream row of s.NodeID as a new stream
	// s.StreamID opens, replacing any, and announces ChangeStream for the
	// node, so that the stream it replaced, on whichever replica, ends.
	RecordAgentStream(ctx context.Context, s AgentStream) error
	// TakeAgentStream is RecordAgentStream conditionally on the row it
	// replaces being stream prev's (prev "": none was read): ErrConflict,
	// and nothing written, if the node has a row of another stream, or
	// prev is not "" and the node has no row (the row read is gone: a
	// store restored from an older backup, a row removed by hand; it is
	// not written back from what was read of it), so that of two streams
	// opening at once each knows which it replaced (the copy signal
	// counts every replacement once, across replicas).
	TakeAgentStream(ctx context.Context, s AgentStream, prev string) error
	// RecordAgentHeartbeat records s.LastSeen and s.Report in the row of
	// s.NodeID, conditionally on the row being stream s.StreamID's and open:
	// ErrConflict, and nothing written, if a newer stream recorded it since
	// or the stream's end was recorded; ErrNotFound if there is no row.
	RecordAgentHeartbeat(ctx context.Context, s AgentStream) error
	// CloseAgentStream marks the stream opened at connectedAt closed, last
	// seen at lastSeen. A row written since by a newer stream (the agent
	// reconnected, perhaps to another replica) is left alone; so is a
	// missing row.
	CloseAgentStream(ctx context.Context, nodeID string, connectedAt, lastSeen time.Time) error
	// CloseRestoredStreams marks closed every row still marked connected,
	// their last-seen times left as they are, with the audit record audit
	// builds, in one transaction, and returns how many it marked: store
	// reapply's, which runs with every authority kept out, so no such row
	// is of a live stream (they are a backup's, of streams ended with the
	// authorities it was taken from). ErrNotFound, and nothing written,
	// if no row is marked connected.
	CloseRestoredStreams(ctx context.Context, audit func(AuditHead) (AuditRecord, error)) (int64, error)
	// GetAgentStream returns a node's stream row; ErrNotFound if the agent
	// never connected.
	GetAgentStream(ctx context.Context, nodeID string) (AgentStream, error)
}
