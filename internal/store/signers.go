package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Signer states, as package signer names them.
const (
	SignerStaged  = "staged"
	SignerActive  = "active"
	SignerGrace   = "grace"
	SignerRetired = "retired"
	SignerRevoked = "revoked"
)

// Signer is one version of the authority's task-signing key. KeyRef is what
// the signer custody keeps for the private key (for sealed custody, the key
// encrypted under the signer purpose); the store never sees the key in
// clear. KeyRef is empty once the private key is destroyed (a retired or
// revoked signer's): the public key stays, for the verifier sets' record.
type Signer struct {
	VersionID   string
	PublicKey   []byte
	KeyRef      []byte
	State       string
	PublishedAt time.Time
	EffectiveAt time.Time
	GraceUntil  time.Time
	RetiresAt   time.Time
	EndedAt     time.Time
	Previous    string
}

// SignerChange is one conditional write of a lifecycle step: insert To
// when From is empty, else update the row of To.VersionID to To only where
// it is still in state From.
type SignerChange struct {
	From string
	To   Signer
	// DropKey empties the row's key reference in the same write: the
	// signer's key is destroyed with the step that ends it (a sealed key,
	// which is its reference). Only for an update to retired or revoked.
	DropKey bool
}

// CheckDropKey refuses a DropKey on an update that does not end the
// signer (to retired or revoked): both stores refuse it, before they
// write anything.
func (c SignerChange) CheckDropKey() error {
	if c.DropKey && c.From != "" && c.To.State != SignerRetired && c.To.State != SignerRevoked {
		return fmt.Errorf("update signer %s: its key is destroyed only with a step to retired or revoked, not %s", c.To.VersionID, c.To.State)
	}
	return nil
}

// SignerSetID identifies the content of a verifier set: its version and
// the store-clock time (Unix microseconds) of the step that made it, 0
// before the first step. The version alone does not: a store restored
// from a backup and stepped back up to the same version holds other
// signers, and the step's time tells the two apart.
type SignerSetID struct {
	Version   int64
	SteppedAt int64
}

// SignerStore keeps the signers and the verifier set's version. Safe for
// concurrent use.
type SignerStore interface {
	// ListSigners returns every signer, oldest published first (ties by
	// version ID), and the verifier set's ID, read with them: its version
	// is the number of change sets applied so far (0 before the first
	// signer).
	ListSigners(ctx context.Context) ([]Signer, SignerSetID, error)
	// SignerSetID returns the verifier set's ID alone: one single-row read
	// of committed state, so a replica that compares it with the ID of a
	// set it signed earlier knows whether that set is still current,
	// whichever replica made the last step, and also after a restore.
	SignerSetID(ctx context.Context) (SignerSetID, error)
	// ApplySignerChanges writes changes in one transaction, in order, and
	// advances the verifier set from expect, the set ID the changes were
	// planned from, to version expect.Version+1, which it returns, stamping
	// the set with the store clock (SignerSetID.SteppedAt). The step is
	// conditional on the whole ID, not the version alone: a store restored
	// from a backup and stepped back up to expect.Version holds other
	// signers, and a change planned from the version before the restore
	// must not land on them. Sets kept above expect.Version go in the same
	// write, and so does one kept at expect.Version for another step time:
	// none of them is this set's (left by an earlier life of a restored
	// store, or by a replica of an older release), and the new version's
	// set is signed afresh. ErrConflict, and nothing written, if the
	// store's set ID is no longer expect (another change won, or the store
	// was restored under the caller, who reads the signers again), if an
	// updated row is not in its From state, if an inserted version ID
	// exists, or if a write would leave two signers staged, active or in
	// grace (a partial unique index). Of several change sets computed from
	// one set ID, across processes, exactly one succeeds. audit builds
	// the step's record (node_task_signer.<action>), appended in the same
	// transaction (see Store.AppendAudit): an error building or appending
	// it is returned and nothing is written; a nil audit is refused.
	ApplySignerChanges(ctx context.Context, expect SignerSetID, changes []SignerChange, audit func(head AuditHead) (AuditRecord, error)) (int64, error)
	// AdvanceSignerSet moves the verifier set from expect (the set ID the
	// caller read) to version to (> expect.Version) with no signer
	// changed, stamping it like a step, and keeps set, the signed verifier
	// set of version to, in the same transaction: after a store restore,
	// so the next set is newer than what agents hold. The set goes with
	// the advance because only the advance knows which key the agents
	// hold: a replica that saw the version moved with no set kept would
	// sign one with the store's active key, which the agents may hold only
	// in grace. ErrConflict, and nothing written, if the store's set ID is
	// no longer expect (conditional on the whole ID, as
	// ApplySignerChanges) or to is not above expect.Version. Sets kept
	// above expect.Version (left by an earlier life of the store) go, as
	// does one at expect.Version for another step time, and one kept for
	// to is replaced: the version was below them until this write, so no
	// set of this store's was served there. An empty set is refused.
	// audit builds its record (node_task_signer.advance), appended in the
	// same transaction, as ApplySignerChanges's.
	AdvanceSignerSet(ctx context.Context, expect SignerSetID, to int64, set []byte, audit func(head AuditHead) (AuditRecord, error)) error
	// DropSignerKey empties the key reference of a retired or revoked
	// signer once its custody object is destroyed (a token's key, which
	// outlives the step that ended the signer until the token answers),
	// or of one ended before keys were destroyed: one conditional write,
	// only where the row is retired or revoked and still holds ref.
	// ErrConflict, and nothing written, otherwise (another replica
	// emptied it first, or the row is not what was read). The verifier
	// set version does not move: no set names a key reference. audit
	// builds its record (node_task_signer.destroy_key), appended in the
	// same transaction, as ApplySignerChanges's: a reference whose record
	// cannot be written stays, for the next pass.
	DropSignerKey(ctx context.Context, versionID string, ref []byte, audit func(head AuditHead) (AuditRecord, error)) error
	// PutVerifierSet keeps raw as the signed verifier set of id.Version,
	// signed from the signer rows read with id, in one conditional write:
	// only while the store's set ID is still id. ErrConflict, and nothing
	// written, once it is not: a step or an advance came after the read
	// (the set is of a version no longer current), or the store was
	// restored under the replica (the version may be the same, or even
	// below, with other signers: the step's time tells them apart). Each
	// kept set carries the step time of its ID: a second write for the
	// current ID keeps the first and is not an error (replicas signing the
	// same version race harmlessly, and each reads back the one kept); a
	// set kept at id.Version for another step time (or none: kept by an
	// older release and not stamped since) is not this ID's and is
	// replaced. An empty set is refused.
	PutVerifierSet(ctx context.Context, id SignerSetID, raw []byte) error
	// VerifierSets returns the kept sets of versions above after and at
	// most the store's current version (read in the same statement),
	// oldest first, at most limit of them. The current version's set is
	// listed only if it carries the current step time: one kept there for
	// another step is not this store's set.
	VerifierSets(ctx context.Context, after int64, limit int) ([]PublishedSet, error)
}

// PublishedSet is one signed verifier set as the authority published it.
type PublishedSet struct {
	Version int64
	Raw     []byte
}

// MaxSignerSetVersion bounds the verifier set version: ApplySignerChanges
// and AdvanceSignerSet refuse to reach it (ErrSetVersionExhausted), so no
// advance, however reached, brings the version near overflow.
const MaxSignerSetVersion = math.MaxInt64 / 2

// ErrSetVersionExhausted refuses a verifier set version at or above
// MaxSignerSetVersion.
var ErrSetVersionExhausted = errors.New("store: verifier set version at its bound")

// StepMoved is the refusal of a step or an advance planned from expect
// while the store's set ID is another: ErrConflict. The store's ID is not
// read in the refused write, so it is not named.
func StepMoved(op string, expect SignerSetID) error {
	return fmt.Errorf("%s: the verifier set is no longer version %d stepped at %d (another step came first, or the store was restored under this replica): %w",
		op, expect.Version, expect.SteppedAt, ErrConflict)
}

// SetMoved is PutVerifierSet's refusal of a set signed at signed while
// the store's set ID is current: ErrConflict, naming both, so the replica
// that signed it reads the signers again.
func SetMoved(signed, current SignerSetID) error {
	why := "a later step or advance"
	if current.Version <= signed.Version {
		why = "a store restored under the replica"
	}
	return fmt.Errorf("verifier set signed at version %d (stepped at %d), the store's is %d (stepped at %d), %s: %w",
		signed.Version, signed.SteppedAt, current.Version, current.SteppedAt, why, ErrConflict)
}
