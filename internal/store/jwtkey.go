package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"
)

// JWTKey is the version of the JWT-SVID signing key the authority's
// replicas sign with (docs/workload-api.md): the keys themselves are
// derived from the storage key by version and salt, so the store holds
// only which version is current, since when, and the salts.
type JWTKey struct {
	// Version is the current version, from 1.
	Version int64
	// RotatedAt is when Version became current (the store clock; for
	// version 1, when the store was made or upgraded).
	RotatedAt time.Time
	// Salt, PrevSalt and NextSalt go into the keys of Version,
	// Version-1 and Version+1 (lowercase hexadecimal; "": none, a key
	// derived from the version alone, as every key was before migration
	// 0028). Each is drawn at random by the rotation that makes its
	// version the next one. The version alone does not name a key: a
	// store restored from an older backup and rotated back up reaches
	// versions it had before, and with their old keys a key made since
	// the backup (and rotated away after a leak) would sign again.
	Salt, PrevSalt, NextSalt string
}

// JWTKeyStore keeps the JWT-SVID key version. Safe for concurrent use.
type JWTKeyStore interface {
	// GetJWTKey returns the current version.
	GetJWTKey(ctx context.Context) (JWTKey, error)
	// RotateJWTKey makes version from.Version+1 current, RotatedAt the
	// store clock, its Salt from.NextSalt, PrevSalt from.Salt and
	// NextSalt a new random one, in one conditional write: only while the stored key is
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

// NewJWTKeySalt draws the salt of the version a rotation makes the next
// one: 128 random bits, so no two rotations, before or after a restore,
// draw the same.
func NewJWTKeySalt() string {
	b := make([]byte, 16)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
