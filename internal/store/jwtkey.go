package store

import (
	"context"
	"time"
)

// JWTKey is the version of the JWT-SVID signing key the authority's
// replicas sign with (docs/workload-api.md): the keys themselves are
// derived from the storage key by version, so the store holds only which
// version is current and since when.
type JWTKey struct {
	// Version is the current version, from 1.
	Version int64
	// RotatedAt is when Version became current (the store clock; for
	// version 1, when the store was made or upgraded).
	RotatedAt time.Time
}

// JWTKeyStore keeps the JWT-SVID key version. Safe for concurrent use.
type JWTKeyStore interface {
	// GetJWTKey returns the current version.
	GetJWTKey(ctx context.Context) (JWTKey, error)
	// RotateJWTKey makes version from.Version+1 current, RotatedAt the
	// store clock, in one conditional write: only while the stored key is
	// from as the caller read it, its Version and RotatedAt. The version
	// alone does not identify it: a store restored from a backup and
	// rotated back up to the same version made it current at another
	// time, and a rotation due by the lost RotatedAt would retire the new
	// one at once. ErrConflict, and nothing written, when another rotation
	// came first. It returns the new version. audit builds its record
	// (jwt.rotate), appended in the same transaction (see
	// Store.AppendAudit): an error building or appending it is returned
	// and nothing is written; a nil audit is refused.
	RotateJWTKey(ctx context.Context, from JWTKey, audit func(head AuditHead) (AuditRecord, error)) (JWTKey, error)
}
