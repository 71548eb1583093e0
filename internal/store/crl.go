package store

import (
	"context"
	"time"
)

// RevokedReasonDeleted is RevokedCertificate.Reason for a certificate of a
// deleted node; the others are the lock kind that revokes it.
const RevokedReasonDeleted = "deleted"

// RevokedCertificate is one unexpired certificate that relying parties
// must stop trusting: a node's, locked (node, instance or public key) or
// deleted, or an operator's, locked (admin).
type RevokedCertificate struct {
	Serial    string // lower-case hex
	NotBefore time.Time
	NotAfter  time.Time
	// Operator: an operator certificate (issued by the admin
	// intermediate); otherwise a node's (the agent intermediate).
	Operator bool
	// Reason is the kind of the lock in force, or RevokedReasonDeleted.
	Reason string
	// Since is when that lock was created; zero for a deleted node (the
	// store keeps no time of deletion).
	Since time.Time
}

// CRL is the latest certificate revocation list signed for one issuing
// intermediate, shared by every replica so they serve the same list and
// agree on its number.
type CRL struct {
	// Issuer names the intermediate: ROLE-SERIAL (its serial in lower-case
	// hex), as in the list's URL path.
	Issuer     string
	Number     int64
	ThisUpdate time.Time
	NextUpdate time.Time
	// Digest identifies the entries the list holds, so a replica can tell
	// whether the stored list already says what it would sign.
	Digest []byte
	DER    []byte
}

// CRLStore keeps the revocation lists and reads what goes into them. Safe
// for concurrent use.
type CRLStore interface {
	// ListRevokedCertificates returns every certificate not expired by
	// the store clock that a lock in force (by the store clock) on its
	// node, instance or public key, or on its operator's name, or its
	// node's deletion, revokes, in one read. Deleted nodes are looked at
	// only when their instance's last certificate was issued after
	// issuedAfter (the longest leaf lifetime ago: older ones hold nothing
	// unexpired). A certificate revoked for several reasons appears once
	// per reason, in no particular order.
	ListRevokedCertificates(ctx context.Context, issuedAfter time.Time) ([]RevokedCertificate, error)
	// GetCRL returns the stored list of issuer; ErrNotFound if none was
	// stored.
	GetCRL(ctx context.Context, issuer string) (CRL, error)
	// PutCRL stores c as the list of c.Issuer if the stored one is prev
	// as the caller read it, its Number and ThisUpdate (Number 0: none is
	// stored), in one conditional write: of several replicas writing
	// after the same list, one wins and the others get ErrConflict, so
	// numbers never repeat or go back. The number alone does not identify
	// the list: a store restored from an older backup may sign its way
	// back up to a number it held before the restore (numbers run ahead
	// of the signing second in a burst of lists), and a list signed from
	// a read of the lost one would replace the restored store's unseen.
	// c.Number must be greater than prev.Number (else ErrConflict).
	PutCRL(ctx context.Context, c CRL, prev CRL) error
}
