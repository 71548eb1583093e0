package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of the bound-keypair claims. Each names the one
// condition that failed at the write, so the caller can tell a lost race
// from a stale join state without a second read.
var (
	// ErrKeyBindingChanged: the token's bound public key was not the one
	// the binding expected (another join bound or rotated it first).
	ErrKeyBindingChanged = errors.New("store: bound public key changed")
	// ErrRegistrationClosed: the registration secret is already used, or
	// must_register_before has passed by the store clock.
	ErrRegistrationClosed = errors.New("store: registration closed")
	// ErrRecoveryExhausted: a counted recovery found recovery_count at
	// the limit.
	ErrRecoveryExhausted = errors.New("store: recovery budget exhausted")
	// ErrRecoverySequenceChanged: the token's recovery sequence was not the
	// one the recovery expected (another recovery committed first).
	ErrRecoverySequenceChanged = errors.New("store: recovery sequence changed")
)

// Recovery modes of a bound-keypair token (DESIGN.md, join method 3).
const (
	RecoveryStandard = "standard"
	RecoveryRelaxed  = "relaxed"
	RecoveryInsecure = "insecure"
)

// BoundKeypairSpec is the part of a bound-keypair token people write.
// Public keys are in the canonical authorized_keys form the boundkeypair
// package produces; the store compares them as strings.
type BoundKeypairSpec struct {
	InitialPublicKey   string
	MustRegisterBefore time.Time // zero: no registration window
	RecoveryLimit      int64
	RecoveryMode       string
	RotateAfter        time.Time // zero: never asked
}

// BoundKeypair is a bound-keypair token's spec and status. The
// registration secret is kept only sealed (with the token ID as
// additional data) and cleared by the write that uses it.
type BoundKeypair struct {
	Spec BoundKeypairSpec
	// SecretCiphertext and SecretNonce hold the sealed registration
	// secret; both nil when there is none or it was used.
	SecretCiphertext []byte
	SecretNonce      []byte
	BoundPublicKey   string // "" until a key is bound
	BoundInstanceID  string // the instance of the last join or recovery
	RecoveryCount    int64  // counted recoveries (standard mode)
	// RecoverySequence advances with every recovery, counted or not; the
	// join state document carries it, so an older one is detectably stale.
	RecoverySequence int64
	// Epoch is the authority epoch (ResyncEpoch) of the token's last
	// recovery: its join state documents carry it.
	Epoch           string
	LastRecoveredAt time.Time
	LastRotatedAt   time.Time
}

// KeyBinding binds a public key to a bound-keypair token in the join's
// (or renewal's) write, only if the token's bound key is still Expected
// ("" for the first binding): ErrKeyBindingChanged otherwise. With
// UseRegistrationSecret the registration secret is consumed in the same
// write, only while it is unused and before must_register_before by the
// store clock (ErrRegistrationClosed). Rotate records LastRotatedAt. A join
// also records its instance as the bound instance. DropRegistrationSecret
// clears the registration secret with no condition on it: a resync that
// binds the key of an agent which used the secret after the backup the
// store was restored from, so the restored secret is not left to show.
// A binding of Expected to itself changes nothing: a refresh's write
// carries one so that it holds only while the token exists
// (ErrNotFound) still bound to the key it proved.
type KeyBinding struct {
	TokenID                string
	Expected               string
	PublicKey              string
	UseRegistrationSecret  bool
	Rotate                 bool
	DropRegistrationSecret bool
}

// Recovery advances a bound-keypair token's recovery sequence from
// ExpectedSequence to ExpectedSequence+1 (or to Sequence, if set), records
// Epoch as the token's epoch and the join's instance as the bound one:
// ErrRecoverySequenceChanged if the sequence or the epoch (ExpectedEpoch)
// moved. Counted (standard mode) also takes one of the recovery budget,
// only while recovery_count < limit: ErrRecoveryExhausted. Resync (a join
// state ahead of a restored store, brought forward) holds only while
// Epoch's window is open by the store clock: ErrResyncClosed. Only a join
// carries it.
type Recovery struct {
	TokenID          string
	ExpectedSequence int64
	ExpectedEpoch    string
	Counted          bool
	Epoch            string
	Sequence         int64
	Resync           bool
}

// NewSequence is the sequence the recovery records.
func (r Recovery) NewSequence() int64 {
	if r.Sequence != 0 {
		return r.Sequence
	}
	return r.ExpectedSequence + 1
}

func (KeyBinding) claim() {}
func (Recovery) claim()   {}

// JoinStateKey is one version of the authority's join-state signing key.
// Nonce followed by Ciphertext is its custody reference: its private half
// sealed (purpose muster-join-state-encryption, the ID as additional
// data), or, with an empty Nonce, the pkcs11: URI of a token object.
type JoinStateKey struct {
	ID         string
	PublicKey  []byte
	Ciphertext []byte
	Nonce      []byte
	CreatedAt  time.Time
}

// BoundKeypairStore holds what people write of bound-keypair tokens (the
// status changes only through claims: KeyBinding, Recovery) and the
// join-state keys. All methods are safe for concurrent use.
type BoundKeypairStore interface {
	// InsertJoinStateKey adds a key; ErrConflict if its ID exists.
	InsertJoinStateKey(ctx context.Context, k JoinStateKey) error
	// ListJoinStateKeys returns every key, newest first (ties by ID).
	ListJoinStateKeys(ctx context.Context) ([]JoinStateKey, error)
	// UpdateBoundKeypairSpec replaces the spec of a bound-keypair token and
	// its svid_usage ("" or SVIDUsageClient: client only;
	// SVIDUsageClientServer) in one write and returns the token as it now
	// stands; the status is untouched. ErrNotFound if there is no
	// bound-keypair token with that ID.
	UpdateBoundKeypairSpec(ctx context.Context, tokenID string, spec BoundKeypairSpec, svidUsage string) (Token, error)
}

// CarriedJoinState is what store reapply carries of bound-keypair join
// state from the store a restore replaced to the restored store: a
// token's status (State) where the restored store holds it behind (Held,
// as reapply read it), and the join-state keys the restored store lacks,
// so the documents its agents hold verify. TokenID "" carries keys only.
type CarriedJoinState struct {
	TokenID string
	Held    BoundKeypair
	State   BoundKeypair
	Keys    []JoinStateKey
}

// Check refuses a carry that changes nothing, or moves the token back
// within its epoch: a lower recovery sequence or count, or the same
// sequence with nothing else changed. Whether another epoch is ahead only
// the store knows (its ordinals): the write checks that.
func (c CarriedJoinState) Check() error {
	if c.TokenID == "" {
		if len(c.Keys) == 0 {
			return errors.New("no token and no join-state key to carry")
		}
		return nil
	}
	h, s := c.Held, c.State
	switch {
	case s.RecoveryCount < h.RecoveryCount:
		return fmt.Errorf("token %s: recovery count %d, below the %d held", c.TokenID, s.RecoveryCount, h.RecoveryCount)
	case s.Epoch == "" && h.Epoch != "":
		return fmt.Errorf("token %s: the initial epoch, before the held epoch %q", c.TokenID, h.Epoch)
	case s.Epoch != h.Epoch:
		return nil
	case s.RecoverySequence < h.RecoverySequence:
		return fmt.Errorf("token %s: recovery sequence %d, below the %d held", c.TokenID, s.RecoverySequence, h.RecoverySequence)
	case s.RecoverySequence == h.RecoverySequence && s.BoundPublicKey == h.BoundPublicKey && s.BoundInstanceID == h.BoundInstanceID &&
		(len(s.SecretCiphertext) > 0 || len(h.SecretCiphertext) == 0) && !s.LastRotatedAt.After(h.LastRotatedAt):
		return fmt.Errorf("token %s: the join state carried is the one held", c.TokenID)
	}
	return nil
}

// JoinStateCarrier is the write store reapply carries join state with.
type JoinStateCarrier interface {
	// CarryJoinState writes c in one transaction with the record audit
	// builds (store.reapply): the token's status set to c.State (its
	// registration secret only ever cleared), only while the token's row
	// is still c.Held (key, bound instance, sequence, count, epoch, last
	// rotation) and c.State's epoch is Held's or a later one the store
	// knows; and each of c.Keys inserted unless its ID is there.
	// ErrNotFound if the token is gone; ErrConflict, nothing written,
	// when a condition fails or nothing would change. A nil audit is
	// refused.
	CarryJoinState(ctx context.Context, c CarriedJoinState, audit func(head AuditHead) (AuditRecord, error)) error
}
