package store

import (
	"context"
	"encoding/hex"
)

// JoinRead is what a join reads before it writes: the token it presents,
// the node it asks for, and the lock that would refuse it.
type JoinRead struct {
	// Token is the token asked for, with its BoundKeypair for a
	// bound-keypair token; TokenFound is false (and Token zero) when no
	// token has the ID, or none was asked for. The UsesCount and
	// LastUsedAt of a token of unlimited uses may leave out its latest
	// uses here (the PostgreSQL store counts them apart, and a join needs
	// neither); GetToken and the token lists give them whole.
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

// RenewalRead is what a renewal reads before it writes: the record of the
// certificate presented, its instance, the node it was issued to, the
// lock that would refuse it, and the verifier set's ID its answer carries
// the set of (read with them, so the answer needs no read of its own).
type RenewalRead struct {
	Certificate      Certificate
	CertificateFound bool
	Instance         Instance
	InstanceFound    bool
	Node             Node
	NodeFound        bool
	Lock             Lock
	Locked           bool
	// SignerSet is SignerSetID's answer, read in the same round trip.
	SignerSet SignerSetID
}

// RenewalReader serves a renewal's reads in one round trip.
type RenewalReader interface {
	// ReadRenewal returns the record of serial, the instance it names,
	// the node it names and the lock in force (by the store clock) on the
	// earliest of: that node, that instance, the instance's token, the
	// record's public key, then each of keys (public-key lock targets: hex
	// SHA-256 of a SubjectPublicKeyInfo) — the order, and the choice among
	// several locks on one target, of FindAnyLock; empty targets are
	// skipped. What is absent is reported by the flags, never as
	// ErrNotFound; without a record nothing else is read. With a record,
	// SignerSet is the verifier set's ID as SignerSetID reads it.
	ReadRenewal(ctx context.Context, serial string, keys []string) (RenewalRead, error)
}

// RenewalLockTargets are the lock targets ReadRenewal checks, in its
// order, for a record and its instance; a backend that reads them in more
// than one step uses it.
func RenewalLockTargets(c Certificate, in Instance, keys []string) []LockTarget {
	targets := []LockTarget{{LockNode, c.NodeID}, {LockInstance, in.ID}, {LockToken, in.TokenID},
		{LockPublicKey, hex.EncodeToString(c.PublicKey)}}
	for _, k := range keys {
		targets = append(targets, LockTarget{LockPublicKey, k})
	}
	return Named(targets)
}

// Named returns targets without the empty ones (a key about to be
// minted, an instance without a token), leaving targets as they were.
func Named(targets []LockTarget) []LockTarget {
	named := make([]LockTarget, 0, len(targets))
	for _, t := range targets {
		if t.Target != "" {
			named = append(named, t)
		}
	}
	return named
}
