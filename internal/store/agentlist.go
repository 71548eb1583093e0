package store

import (
	"context"
	"time"
)

// AgentRow is what an agents listing shows of one node, read with the page
// instead of with several reads per node.
type AgentRow struct {
	Node Node
	// Instance is the node's current instance without its chain
	// (LastChainPEM is nil): the listing shows NotAfter instead.
	Instance Instance
	// NotAfter is the expiry of the instance's last certificate (zero if
	// its record is missing).
	NotAfter time.Time
	// Lock is the first lock in force on the node, its instance or the
	// instance's token, in FindAnyLock's order (node, instance, token;
	// then oldest); nil for none.
	Lock *Lock
	// Stream is the node's stream row; nil if it never held one.
	Stream *AgentStream
	// BoundKeypair is the state of the instance's token when it joined
	// with a bound keypair and the token still exists; nil otherwise.
	BoundKeypair *BoundKeypair
}

// AgentLister reads agents a page at a time. Safe for concurrent use.
type AgentLister interface {
	// ListAgentsPage returns up to limit agents whose node ID is greater
	// than afterID, ordered by ID ("" starts at the first), in one query
	// (and one more for the bound-keypair state when the page holds a
	// bound-keypair agent).
	ListAgentsPage(ctx context.Context, afterID string, limit int) ([]AgentRow, error)
	// GetAgentRow reads one agent as ListAgentsPage does; ErrNotFound.
	GetAgentRow(ctx context.Context, nodeID string) (AgentRow, error)
}

// BoundKeypairTokenIDs are the tokens of the bound-keypair agents in rows,
// whose state a listing reads in one more query.
func BoundKeypairTokenIDs(rows []AgentRow) []string {
	var ids []string
	for _, r := range rows {
		if r.Instance.JoinMethod == JoinMethodBoundKeypair && r.Instance.TokenID != "" {
			ids = append(ids, r.Instance.TokenID)
		}
	}
	return ids
}

// AttachBoundKeypairs sets the BoundKeypair of each bound-keypair agent in
// rows from byID, the page's bound-keypair rows by token ID (a token that
// is gone has none).
func AttachBoundKeypairs(rows []AgentRow, byID map[string]*BoundKeypair) {
	for i := range rows {
		if in := rows[i].Instance; in.JoinMethod == JoinMethodBoundKeypair {
			rows[i].BoundKeypair = byID[in.TokenID]
		}
	}
}
