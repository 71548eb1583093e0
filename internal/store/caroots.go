package store

import (
	"context"
	"time"
)

// Root rotation phases (DESIGN.md "CA lifecycle, revocation and key
// custody", "Root rotation"). None: no rotation has started, or the last
// one was abandoned from init; the current root signs and is the only one
// trusted. Init and update_agents: both roots are trusted (agents learn the
// new one through a cross-certificate), the old one still signs the
// intermediates. Update_servers: both trusted, the new one signs.
// Standby: the new one alone is trusted and signs; the old one is kept
// only so that a rollback can bring it back.
const (
	RootPhaseNone          = "none"
	RootPhaseInit          = "init"
	RootPhaseUpdateAgents  = "update_agents"
	RootPhaseUpdateServers = "update_servers"
	RootPhaseStandby       = "standby"
)

// RootRotation is the state of the root rotation, one record shared by
// every replica. Old is the root being replaced (nil certificate and key:
// the data directory's root, whose key is in the data directory or
// offline); New is the root that replaces it, its key sealed by key
// custody under muster-ca-encryption. CrossNewByOld certifies the new
// root's key under the old root; CrossOldByNew the old root's key under the
// new one.
type RootRotation struct {
	// Version counts the writes: 0 for a store that never had one.
	Version       int64
	Phase         string
	OldCertDER    []byte
	OldKeyRef     []byte
	NewCertDER    []byte
	NewKeyRef     []byte
	CrossNewByOld []byte
	CrossOldByNew []byte
	// StartedAt is when the rotation in progress began (the last rotate);
	// ChangedAt when the phase last changed. Both are the store clock.
	StartedAt time.Time
	ChangedAt time.Time
}

// CARootStore keeps the root rotation. Safe for concurrent use.
type CARootStore interface {
	// GetRootRotation returns the rotation: Version 0 and Phase none when
	// none was ever written.
	GetRootRotation(ctx context.Context) (RootRotation, error)
	// PutRootRotation replaces the rotation with r, one conditional write:
	// only while the stored rotation is from as the caller read it, its
	// Version and ChangedAt (Version 0: none written yet, ChangedAt
	// ignored). The version alone does not identify it: a store restored
	// from a backup and stepped back up to the same version holds another
	// rotation, and a step planned from the lost one would write its roots
	// over it; ChangedAt, the store clock of the write, tells the two
	// apart. The stored version becomes from.Version+1, ChangedAt the
	// store clock, and
	// StartedAt too when restart is set (a new rotation), else it is
	// kept. ErrConflict, and nothing written, when another write came
	// first. Announces ChangeCA. audit builds its record
	// (ca.root_prepare, ca.root_rotate, ca.root_phase,
	// ca.root_export_key), appended in the same transaction (see
	// AppendAudit): an error building or appending it is returned and
	// nothing is written; a nil audit is refused.
	PutRootRotation(ctx context.Context, from RootRotation, r RootRotation, restart bool, audit func(head AuditHead) (AuditRecord, error)) error
	// DiscardCACert retires a prepared intermediate that will never be
	// activated (one signed by a root a rotation step has since stopped
	// using) in one conditional write, returning its key reference (the
	// winner destroys the key; the reference stays until DropCAKey, as
	// RetireCACert's).
	// ErrConflict when serial is not role's prepared certificate.
	// Announces ChangeCA. audit builds its record (ca.discard), appended
	// in the same transaction as PutRootRotation's.
	DiscardCACert(ctx context.Context, role, serial string, audit func(head AuditHead) (AuditRecord, error)) ([]byte, error)
}
