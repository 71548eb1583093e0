package store

import "context"

// JoinRead is what a join reads before it writes: the token it presents,
// the node it asks for, and the lock that would refuse it.
type JoinRead struct {
	// Token is the token asked for, with its BoundKeypair for a
	// bound-keypair token; TokenFound is false (and Token zero) when no
	// token has the ID, or none was asked for.
	Token      Token
	TokenFound bool
	// Node is the node asked for; NodeFound is false when the ID is free,
	// or none was asked for.
	Node      Node
	NodeFound bool
	// Lock is the lock FindAnyLock returns for the targets; Locked is
	// false when none is in force (or no target was given).
	Lock   Lock
	Locked bool
}

// JoinReader serves a join's reads in one round trip to the database.
type JoinReader interface {
	// ReadJoin returns the token tokenID, the node nodeID and the lock in
	// force on the earliest of targets (as FindAnyLock chooses it), each
	// skipped when its argument is empty; what is absent is reported by
	// the flags, never as ErrNotFound. An unknown token ID costs the same
	// look-ups and the same row as a known one (a decoy row, never
	// returned), so the time of a join's refusal does not tell whether the
	// ID exists; GetToken, which the admin API reads, pays no such decoy.
	// Locks are judged by the store clock, like FindAnyLock.
	ReadJoin(ctx context.Context, tokenID, nodeID string, targets []LockTarget) (JoinRead, error)
}
