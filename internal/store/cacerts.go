package store

import (
	"context"
	"time"
)

// CA certificate states (DESIGN.md "CA lifecycle, revocation and key
// custody"): a prepared intermediate is in the trust bundle but signs
// nothing; the active one signs every new leaf of its role; a retiring one
// stays in the bundle until the last leaf it signed has expired; a retired
// one is kept for the record only.
const (
	CAPrepared = "prepared"
	CAActive   = "active"
	CARetiring = "retiring"
	CARetired  = "retired"
)

// CACert is one intermediate CA certificate and the custody reference of
// its key (sealed under muster-ca-encryption for sealed custody: never the
// key in clear). A retired one has given up its key: KeyRef is nil once
// the key is destroyed (DropCAKey), and until then names the key still to
// destroy. Serial is the certificate's serial in lower-case hex,
// unique across roles.
type CACert struct {
	Role        string
	Serial      string
	CertDER     []byte
	KeyRef      []byte
	State       string
	NotAfter    time.Time
	CreatedAt   time.Time
	ActivatedAt time.Time
	RetiringAt  time.Time
	RetiredAt   time.Time
}

// CADraft is the key of an intermediate drafted for an operator to sign
// with an offline root key, kept until the signed certificate comes back
// (or the leader gives up on it and destroys the key).
type CADraft struct {
	Serial    string
	Role      string
	KeyRef    []byte
	CreatedAt time.Time
}

// CAStore keeps the intermediates, shared by every replica. Each write is
// one conditional write and announces ChangeCA. Safe for concurrent use.
type CAStore interface {
	// ListCACerts returns every CA certificate, by role, then oldest
	// created first (ties by serial).
	ListCACerts(ctx context.Context) ([]CACert, error)
	// InsertCACert adds c in state prepared or active; a zero CreatedAt
	// becomes the store clock, as does a zero ActivatedAt of an active
	// one. ErrConflict, and nothing written, on a duplicate serial, or
	// when the role already has a certificate in c's state (one prepared
	// and one active per role, a partial unique index: of replicas
	// preparing or importing at once, exactly one succeeds).
	// audit builds its record (ca.prepare, ca.import, ca.create),
	// appended in the same transaction (see AppendAudit): an error
	// building or appending it is returned and nothing is written; a nil
	// audit is refused.
	InsertCACert(ctx context.Context, c CACert, audit func(head AuditHead) (AuditRecord, error)) error
	// ActivateCACert makes the prepared certificate serial of role active
	// and the role's active one retiring, in one transaction, stamped by
	// the store clock. ErrConflict, and nothing written, when serial is
	// not the role's prepared certificate. audit builds its record
	// (ca.activate), appended in the same transaction as InsertCACert's.
	ActivateCACert(ctx context.Context, role, serial string, audit func(head AuditHead) (AuditRecord, error)) error
	// RetireCACert moves the retiring certificate serial of role to
	// retired in one conditional write, returning its key reference:
	// only the caller whose write won gets it, and destroys the key in
	// custody. The reference stays on the retired row until DropCAKey
	// empties it once the key is destroyed, so a destruction that fails
	// or never happens (a token away, a crash) is seen and taken again.
	// ErrConflict, and no reference, when it is not retiring. audit
	// builds its record (ca.retire), appended in the same transaction as
	// InsertCACert's: a retirement that cannot be audited is not taken,
	// and the key is not destroyed.
	RetireCACert(ctx context.Context, role, serial string, audit func(head AuditHead) (AuditRecord, error)) ([]byte, error)
	// DropCAKey empties the key reference of the retired (or discarded)
	// certificate serial once its custody object is destroyed: one
	// conditional write, only where the row is retired and still holds
	// ref. ErrConflict, and nothing written, otherwise (another replica
	// emptied it first). audit builds its record (ca.destroy_key),
	// appended in the same transaction as InsertCACert's: a reference
	// whose record cannot be written stays, for the next pass.
	DropCAKey(ctx context.Context, serial string, ref []byte, audit func(head AuditHead) (AuditRecord, error)) error
	// InsertCADraft records a draft's key; CreatedAt is the store clock.
	// ErrConflict on a duplicate serial.
	InsertCADraft(ctx context.Context, d CADraft) error
	// ListCADrafts returns every draft, oldest first.
	ListCADrafts(ctx context.Context) ([]CADraft, error)
	// ClaimCADraft deletes the draft serial and returns it, one
	// conditional write: of callers claiming it at once (a prepare and
	// the leader's sweep, two replicas) exactly one gets it and owns its
	// key. ErrNotFound when there is none. audit builds its record
	// (ca.discard), appended in the same transaction as InsertCACert's:
	// a draft whose discard cannot be audited stays, with its key.
	ClaimCADraft(ctx context.Context, serial string, audit func(head AuditHead) (AuditRecord, error)) (CADraft, error)
	// PrepareFromCADraft stores c, prepared, as InsertCACert does, and
	// deletes the draft of c's serial, which must be c's role's and hold
	// c's key reference, in the same transaction: the key goes from the
	// draft to the intermediate in one write, so no crash or replica
	// leaves it in neither (or in both, for the sweep to destroy).
	// ErrNotFound, and nothing written, when there is no such draft
	// (claimed meanwhile); ErrConflict, and nothing written (the draft
	// keeps its key), as InsertCACert. audit builds its record
	// (ca.prepare), appended in the same transaction as InsertCACert's.
	PrepareFromCADraft(ctx context.Context, c CACert, audit func(head AuditHead) (AuditRecord, error)) error
}
