package store

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors of the discovery writes.
var (
	// ErrRootMismatch: the authority ID is registered with another root
	// fingerprint; it stays locked to the first one.
	ErrRootMismatch = errors.New("store: authority ID is registered with another root")
	// ErrStaleVersion: a registration's version is below the registered
	// one, or equal to it with a different document. Versions only go up.
	ErrStaleVersion = errors.New("store: registration version is not newer than the registered one")
	// ErrTicketReplayed: a referral ticket's jti has been used already.
	ErrTicketReplayed = errors.New("store: referral ticket already used")
)

// Registration is an authority's entry in a discovery service. The store
// keeps the signed document as it came and the three fields its rules need.
type Registration struct {
	AuthorityID string
	// RootFingerprint is "sha256:HEX" of the authority's root key; the
	// authority ID stays locked to the first one registered.
	RootFingerprint string
	Version         int64
	// Document is the canonical JSON the signature covers; Signature the
	// policy signing key's signature of it.
	Document  []byte
	Signature []byte
	// RegisteredAt is the first registration, UpdatedAt the last change,
	// both by the store clock (set by PutRegistration).
	RegisteredAt time.Time
	UpdatedAt    time.Time
}

// JoinReport is one join an authority reported to discovery.
type JoinReport struct {
	AuthorityID string
	// ReportID identifies the join (its instance ID); unique per authority,
	// so a replayed report is counted once.
	ReportID string
	NodeID   string
	TicketID string
	JoinedAt time.Time // as the authority signed it
	// ReportedAt is set by the store clock.
	ReportedAt time.Time
}

// Ticket key states.
const (
	TicketKeyActive  = "active"
	TicketKeyRetired = "retired"
)

// TicketKey is one of discovery's referral-ticket signing keys. The private
// key is kept only sealed (Ciphertext and Nonce, with the key ID as
// additional data).
type TicketKey struct {
	ID         string
	PublicKey  []byte // Ed25519, 32 bytes
	Ciphertext []byte
	Nonce      []byte
	Status     string
	CreatedAt  time.Time
	// RetiredAt is set once the key is retired; PublishUntil is how long
	// a retired key stays in the JWKS (tickets it signed are still in
	// flight).
	RetiredAt    time.Time
	PublishUntil time.Time
}

// TicketUse is the single use of a referral ticket, recorded by the
// authority with the join it admitted.
type TicketUse struct {
	ID string // the ticket's jti
	// KeepUntil is when the record may be dropped: past the ticket's
	// expiry and the clock-skew allowance, when no copy can be accepted.
	// Both fields are required; CommitJoin refuses a use without them.
	KeepUntil time.Time
}

// PendingReport is a join the authority has yet to report to discovery
// (ReportJoin). CommitJoin writes one with every join that used a referral
// ticket, in the join's transaction, so the join and its report are durable
// together; the delivery deletes it once discovery has answered.
type PendingReport struct {
	InstanceID string // the join's instance: the report's ID at discovery
	NodeID     string
	TicketID   string    // the referral ticket's jti
	JoinedAt   time.Time // the instance's CreatedAt
	// CreatedAt is set by the store clock when the join commits.
	CreatedAt time.Time
}

// DiscoveryStore is what a discovery service keeps. All methods are safe
// for concurrent use.
type DiscoveryStore interface {
	// PutRegistration records r in one conditional write, by the store
	// clock. A new authority ID is inserted. For a known one:
	// ErrRootMismatch if r.RootFingerprint differs; nothing written and the
	// stored registration returned (changed false) if r.Version equals the
	// stored version and r.Document is byte-identical; ErrStaleVersion if
	// r.Version is lower, or equal with another document; otherwise the
	// registration is replaced (RegisteredAt kept). It returns the
	// registration as stored. When it writes (changed), audit(stored)
	// builds the record (authority.register), appended in the same
	// transaction (see AppendAudit): an error building or appending it is
	// returned and nothing is written. A repeat appends nothing and does
	// not call audit. A nil audit is refused.
	PutRegistration(ctx context.Context, r Registration, audit func(stored Registration) func(head AuditHead) (AuditRecord, error)) (stored Registration, changed bool, err error)
	// GetRegistration returns an authority's registration; ErrNotFound.
	GetRegistration(ctx context.Context, authorityID string) (Registration, error)
	// DeleteRegistration drops an authority's registration, so its ID is
	// free again: the next registration, under any root, is a new one
	// (muster discovery forget). Its join reports are kept and still count
	// toward the quota of whoever registers the ID next. ErrNotFound if
	// there is none.
	DeleteRegistration(ctx context.Context, authorityID string) error

	// RecordJoinReport stores a report unless (AuthorityID, ReportID) is
	// stored already; inserted says which. ReportedAt is the store clock.
	RecordJoinReport(ctx context.Context, r JoinReport) (inserted bool, err error)
	// CountJoinReports counts an authority's reports recorded within the
	// window before the store clock's now.
	CountJoinReports(ctx context.Context, authorityID string, window time.Duration) (int64, error)
	// DeleteJoinReports drops reports recorded more than olderThan before
	// the store clock's now and returns how many.
	DeleteJoinReports(ctx context.Context, olderThan time.Duration) (int64, error)

	// ListTicketKeys returns every ticket key, newest first.
	ListTicketKeys(ctx context.Context) ([]TicketKey, error)
	// RotateTicketKey makes next the active key in one transaction, by the
	// store clock: the active key fromID becomes retired, published until
	// now+overlap, and next is inserted active (its Status and retirement
	// times are ignored; a zero CreatedAt becomes now); an overlap <= 0
	// unpublishes the retired key at once. fromID "" installs
	// the first key. ErrConflict, and nothing written, if fromID is not the
	// active key when the transaction runs ("" : if any active key exists),
	// or if next's ID exists: of several rotations from one key exactly
	// one succeeds, across processes.
	RotateTicketKey(ctx context.Context, fromID string, next TicketKey, overlap time.Duration) error
	// DeleteRetiredTicketKeys drops retired keys whose publication ended
	// by the store clock and returns their IDs in ascending order.
	DeleteRetiredTicketKeys(ctx context.Context) ([]string, error)
}

// TicketUseStore records referral-ticket uses on the authority's side. The
// use itself is written by CommitJoin (Join.Ticket), in the join's
// transaction.
type TicketUseStore interface {
	// TicketUsed reports whether a ticket's jti is recorded.
	TicketUsed(ctx context.Context, id string) (bool, error)
	// DeleteTicketUses drops uses whose KeepUntil has passed by the store
	// clock and returns how many.
	DeleteTicketUses(ctx context.Context) (int64, error)
}

// ReportOutbox is the authority's outbox of join reports to discovery. The
// reports are written by CommitJoin (Join.Ticket), never by the caller;
// delivery reads and deletes them, so a report outlives a crash and is
// sent until discovery has answered it (discovery counts each instance
// once, so a report sent twice is counted once). All methods are safe for
// concurrent use.
type ReportOutbox interface {
	// ListPendingReports returns up to limit reports, oldest first (by
	// CreatedAt, then InstanceID). A limit below 1 is an error.
	ListPendingReports(ctx context.Context, limit int) ([]PendingReport, error)
	// CountPendingReports returns how many reports are pending.
	CountPendingReports(ctx context.Context) (int64, error)
	// DeletePendingReport drops the report of an instance; ErrNotFound if
	// there is none (another replica delivered it, for example).
	DeletePendingReport(ctx context.Context, instanceID string) error
}
