// Package signer holds the authority's task-signing keys (DESIGN.md "Signed
// tasks and the signer lifecycle"; seed "Node Task Signing Lifecycle v1"):
// versioned Ed25519 signers, the states a version moves through and the one
// table of transitions between them, the custody of private keys, and the
// verifier set document agents trust.
//
// The package decides; it never writes. A lifecycle operation returns the
// changes it implies (Plan), and the store applies each as one conditional
// write on the state it expects, so two replicas acting at once cannot both
// succeed.
package signer

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/spiffeid"
)

// State is where one signer version is in its life.
type State string

// Signer states. At most one signer is active; at most one is staged; at
// most one is in grace.
const (
	// Staged: published to agents, not yet signing.
	Staged State = "staged"
	// Active: signs every new task and verifier set.
	Active State = "active"
	// Grace: replaced, still accepted by agents until RetiresAt.
	Grace State = "grace"
	// Retired: no longer accepted; kept for the record.
	Retired State = "retired"
	// Revoked: distrusted at once; the next verifier set names it revoked.
	Revoked State = "revoked"
)

// Valid reports whether s is one of the five states.
func (s State) Valid() bool {
	switch s {
	case Staged, Active, Grace, Retired, Revoked:
		return true
	}
	return false
}

// Ended reports whether s is retired or revoked: no step leads back to
// signing from there, so the private key is destroyed (the public key
// stays, for the verifier sets' record).
func (s State) Ended() bool { return s == Retired || s == Revoked }

// Trusted reports whether agents accept signatures of a signer in state s.
func (s State) Trusted() bool { return s == Staged || s == Active || s == Grace }

// Signer is one version of the task-signing key, without its private half.
type Signer struct {
	VersionID string
	PublicKey ed25519.PublicKey
	State     State
	// PublishedAt is when the version was created and published to agents.
	PublishedAt time.Time
	// EffectiveAt is when it becomes (or became) active.
	EffectiveAt time.Time
	// GraceUntil is the end of the grace of the signer this one replaces:
	// agents keep accepting the predecessor until then. GraceUntil minus
	// EffectiveAt is the grace length the operator asked for at stage
	// (GraceLength); every step that moves EffectiveAt moves GraceUntil with
	// it, so the length is kept on the signer without a column of its own.
	GraceUntil time.Time
	// RetiresAt is when a signer in grace stops being accepted; set when it
	// enters grace.
	RetiresAt time.Time
	// EndedAt is when it was retired or revoked.
	EndedAt time.Time
	// Previous is the version that was active when this one was staged.
	Previous string
}

// GraceLength is the grace the operator asked for when this signer was
// staged: how long its predecessor stays accepted after its activation.
func (s Signer) GraceLength() time.Duration { return s.GraceUntil.Sub(s.EffectiveAt) }

// ErrMalformedVersionID is returned for a version ID outside the node-ID
// form (spiffeid.ValidNodeID), which keeps it safe in file names, logs and audit targets.
var ErrMalformedVersionID = errors.New("signer: version ID must match ^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")

// ValidVersionID checks a version ID's form.
func ValidVersionID(id string) error {
	if spiffeid.ValidNodeID(id) != nil {
		return ErrMalformedVersionID
	}
	return nil
}

// NextVersionID returns "v<N+1>" where N is the highest version number
// among signers ("v<N>" or "v<N>-<key hash>"), so operators read versions
// in order. Two replicas computing the same ID at once collide on the
// store's unique key and one retries.
func NextVersionID(signers []Signer) string {
	var n uint64
	for _, s := range signers {
		num, _, _ := strings.Cut(s.VersionID, "-")
		if v, err := strconv.ParseUint(strings.TrimPrefix(num, "v"), 10, 63); err == nil && strings.HasPrefix(num, "v") && v > n {
			n = v
		}
	}
	return "v" + strconv.FormatUint(n+1, 10)
}

// KeyVersionID is the version ID of a staged signer: base ("v<N>",
// NextVersionID) and the first 8 hex digits of the SHA-256 of its public
// key, e.g. v4-3fa9c2d1. The number keeps versions readable in order; the
// hash means one ID never names two keys, even after the store is restored
// from a backup and the number is handed out again, so an agent holding the
// earlier key refuses nothing (DESIGN.md: IDs are never reused).
func KeyVersionID(base string, pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return base + "-" + hex.EncodeToString(sum[:4])
}

// custodyID is the name custody knows a signer's key by: the ID it was
// generated under, the part before the key hash (KeyVersionID). Custody
// also checks the key it opens is the row's public key, which the hash
// names, so a key reference moved to another row still does not sign.
func custodyID(versionID string) string {
	base, _, _ := strings.Cut(versionID, "-")
	return base
}

// EncodePublicKey is the text form of a public key on the wire and in
// documents: base64url without padding.
func EncodePublicKey(pub ed25519.PublicKey) string {
	return base64.RawURLEncoding.EncodeToString(pub)
}

// ParsePublicKey reads the text form, refusing anything that is not 32
// bytes of base64url without padding.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("signer: public key is not %d bytes of base64url without padding", ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}
