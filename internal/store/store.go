// Package store defines what muster keeps in its database: the record types,
// the sentinel errors, and the Store interface that every backend (SQLite
// embedded, PostgreSQL for replicas) implements and that the conformance
// suite in storetest checks.
//
// Everything that must happen once is a single conditional write or a unique
// constraint inside the backend, never an in-process lock, so the contract
// holds with several authority replicas on one database. Deadlines the
// authority owns (lock TTLs, grace windows) are compared with the store's own
// clock, which Now reports.
//
// Times are kept to the microsecond, in UTC: backends drop finer digits and
// return every time in UTC; a zero time is stored as absent and returned as
// the zero time.
//
// The package holds no SQL: backends live in subpackages.
package store

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors. Backends wrap them with %w; callers test with errors.Is.
var (
	// ErrNotFound: the addressed row does not exist (or is expired where the
	// method says so).
	ErrNotFound = errors.New("store: not found")
	// ErrConflict: a uniqueness or state precondition of a conditional write
	// failed; nothing was changed.
	ErrConflict = errors.New("store: conflict")
	// ErrSchemaTooNew: the database was migrated by a newer muster
	// (SchemaTooNewError says by how much and what to do).
	ErrSchemaTooNew = errors.New("store: database schema is newer than this binary")
	// ErrUnavailable: the database cannot take the write now (its disk is
	// full, or it is out of resources); nothing was changed, and the same
	// request may succeed later.
	ErrUnavailable = errors.New("store: unavailable")
)

// PSK states.
const (
	PSKActive  = "active"
	PSKGrace   = "grace"
	PSKRevoked = "revoked"
)

// PSK is one bootstrap pre-shared key, encrypted at rest. The plaintext never
// reaches the store.
type PSK struct {
	ID         string
	Ciphertext []byte
	Nonce      []byte
	Status     string
	CreatedAt  time.Time
	// GraceExpiresAt is set while Status is grace.
	GraceExpiresAt time.Time
	// RevokedAt is set once Status is revoked.
	RevokedAt time.Time
}

// Operator is one certificate issued to an operator identity.
type Operator struct {
	Serial    string // lower-case hex, unique
	Name      string
	SPIFFEID  string
	NotBefore time.Time
	NotAfter  time.Time
	CreatedBy string
	CreatedAt time.Time
	// Reissue, on insert only, allows a certificate beside a valid one of
	// the same name: an operator renewing its identity, asked for
	// explicitly.
	Reissue bool
}

// OperatorStanding is what an admin call is judged by, read together.
type OperatorStanding struct {
	// Known says the store holds the caller's serial as a certificate of
	// its name: a store restored from a backup taken before the
	// certificate was issued does not.
	Known bool
	// Lock is the lock in force on the name, valid when Locked.
	Lock   Lock
	Locked bool
}

// Lock kinds.
const (
	LockNode      = "node"
	LockInstance  = "instance"
	LockToken     = "token"
	LockPublicKey = "public_key"
	LockAdmin     = "admin"
)

// LockTarget is what a lock can apply to: a lock kind and its target (a
// node ID, instance ID, token ID, public key hash or operator name).
type LockTarget struct{ Kind, Target string }

// Lock is a deny rule on one target. A zero ExpiresAt never expires; any
// other is in force while the store clock is before it.
type Lock struct {
	ID        string
	Kind      string
	Target    string
	Reason    string
	CreatedBy string
	CreatedAt time.Time
	ExpiresAt time.Time
}

// AuditRecord is one link of the audit chain. Seq starts at 1 and has no
// gaps; Hash covers PrevHash and every other field (see package audit).
type AuditRecord struct {
	Seq           int64
	Time          time.Time
	Actor         string
	Action        string
	Target        string
	Result        string
	Reason        string
	Source        string
	CorrelationID string
	PrevHash      []byte
	Hash          []byte
}

// AuditHead is the last record of the chain: Seq 0 and a nil Hash for an
// empty chain.
type AuditHead struct {
	Seq  int64
	Hash []byte
}

// AuditFilter selects records for ListAudit. Zero fields match everything.
type AuditFilter struct {
	Since time.Time
	// Action matches exactly, or as a prefix when it ends in '*'.
	Action   string
	AfterSeq int64
	// Limit caps the number of records; 0 means the backend default (1000).
	Limit int
}

// AuditCheckpoint is a signed statement of the chain head at Seq.
type AuditCheckpoint struct {
	Seq       int64
	Hash      []byte
	Time      time.Time
	KeyID     string
	Signature []byte
}

// Store is the whole persistence contract of the authority. All methods are
// safe for concurrent use.
type Store interface {
	// SchemaVersion returns the migration version the database is at.
	SchemaVersion(ctx context.Context) (int, error)
	// Now returns the store's clock, the one authority deadlines use.
	Now(ctx context.Context) (time.Time, error)
	Close() error

	// InsertPSK adds a PSK. ErrConflict if its ID exists, or if it is
	// active and an active PSK exists, or grace and a grace PSK exists.
	// audit builds its record (psk.create), appended in the same
	// transaction (see AppendAudit): an error building or appending it is
	// returned and nothing is written; a nil audit is refused.
	InsertPSK(ctx context.Context, p PSK, audit func(head AuditHead) (AuditRecord, error)) error
	// ListPSKs returns every PSK, newest first.
	ListPSKs(ctx context.Context) ([]PSK, error)
	// RotatePSK replaces the active PSK fromID with newPSK in one
	// transaction, by the store clock: the current grace PSK, if any,
	// becomes revoked; fromID becomes grace until now+grace, or revoked at
	// once when grace <= 0; newPSK is inserted active (its Status and its
	// grace and revocation times are ignored; a zero CreatedAt becomes now).
	// It returns fromID's row as it now stands. ErrConflict, and nothing
	// written, if fromID is not the active PSK when the transaction runs
	// (another rotation won: of several rotations from one active PSK,
	// exactly one succeeds, across processes) or if newPSK's ID exists.
	// audit builds its record (psk.rotate), appended in the same
	// transaction (see AppendAudit): an error building or appending it is
	// returned and nothing is written; a nil audit is refused.
	RotatePSK(ctx context.Context, fromID string, newPSK PSK, grace time.Duration, audit func(head AuditHead) (AuditRecord, error)) (old PSK, err error)
	// RevokeExpiredGracePSKs revokes every grace PSK whose grace has ended
	// by the store clock and returns their IDs in ascending order (none is
	// not an error). When it revokes any, audit(ids) builds their record
	// (psk.expire), appended in the same transaction: an error building
	// or appending it is returned and the PSKs stay in grace (a grace
	// past its end admits no one: see the enroll check). When it revokes
	// none, audit is not called and nothing is appended. A nil audit is
	// refused.
	RevokeExpiredGracePSKs(ctx context.Context, audit func(ids []string) func(head AuditHead) (AuditRecord, error)) ([]string, error)

	// InsertOperator records an issued operator certificate; ErrConflict on
	// a duplicate serial, or while a certificate of the same name is valid
	// at o.CreatedAt and o.Reissue is false (one writer wins among concurrent ones, across
	// replicas).
	// audit builds its record (operator.add, operator.renew), appended
	// to the chain in the same transaction (see AppendAudit): an error
	// building or appending it is returned and nothing is written; a nil
	// audit is refused.
	InsertOperator(ctx context.Context, o Operator, audit func(head AuditHead) (AuditRecord, error)) error
	// ListOperators returns every operator certificate, oldest first.
	ListOperators(ctx context.Context) ([]Operator, error)
	// ReadOperatorStanding returns, in one query, what an admin call is
	// judged by: whether the store holds serial as a certificate of the
	// operator name, and the lock FindAnyLock would return for
	// {LockAdmin, name}.
	ReadOperatorStanding(ctx context.Context, serial, name string) (OperatorStanding, error)

	// InsertLock adds a lock; ErrConflict on a duplicate ID. audit
	// builds the lock's record (lock.create), appended to the chain in
	// the same transaction (see AppendAudit): the lock is in force with
	// its record or not at all. An error building or appending it is
	// returned and nothing is written; a nil audit is refused.
	InsertLock(ctx context.Context, l Lock, audit func(head AuditHead) (AuditRecord, error)) error
	// ListLocks returns the locks not expired by the store clock, oldest
	// first.
	ListLocks(ctx context.Context) ([]Lock, error)
	// DeleteLock removes a lock; ErrNotFound if there is none with that
	// ID. audit builds its record (lock.delete), appended in the same
	// transaction as InsertLock's: an error building or appending it is
	// returned and the lock stays; a nil audit is refused.
	DeleteLock(ctx context.Context, id string, audit func(head AuditHead) (AuditRecord, error)) error
	// FindAnyLock returns a lock not expired by the store clock on any of
	// targets, in at most one query; ErrNotFound if there is none, and for
	// no targets (without a query). When several match, it returns the
	// lock on the earliest target in the list (of several on that target,
	// the oldest, ties by ID): a caller lists targets from the reason it
	// would name first to the last, and a refusal names the same lock
	// every time.
	FindAnyLock(ctx context.Context, targets []LockTarget) (Lock, error)
	// LockEnd returns when the last of the locks in force (by the store
	// clock) on targets ends: the latest ExpiresAt among them, zero if
	// any of them has none (only its deletion ends it); ErrNotFound if
	// none is in force, and for no targets. A refusal for the lock
	// FindAnyLock names is told to end then, not when that lock does:
	// another that applies may end later. In one query.
	LockEnd(ctx context.Context, targets []LockTarget) (time.Time, error)

	// AppendAudit appends one record to the chain. It calls build with a
	// head, which returns the record to follow it (its Seq must be
	// head.Seq+1 and its PrevHash head.Hash, else ErrConflict), and inserts
	// the record only if, under the lock that serializes every writer of
	// the chain, the head is still that one. The head may be read under
	// that lock or be a guess (a store's own last record), so build may
	// run outside the lock and more than once; only the record built on
	// the head found under the lock is inserted. If build returns an
	// error, AppendAudit returns it wrapped. On any error nothing is
	// written. build must be fast and must not touch the store.
	AppendAudit(ctx context.Context, build func(head AuditHead) (AuditRecord, error)) (AuditRecord, error)
	// AuditHead returns the last record's seq and hash.
	AuditHead(ctx context.Context) (AuditHead, error)
	// ListAudit returns matching records in ascending Seq.
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditRecord, error)
	// InsertAuditCheckpoint stores a checkpoint; ErrConflict on a
	// duplicate Seq.
	InsertAuditCheckpoint(ctx context.Context, c AuditCheckpoint) error
	// ListAuditCheckpoints returns every checkpoint in ascending Seq.
	ListAuditCheckpoints(ctx context.Context) ([]AuditCheckpoint, error)

	JoinStore
	JoinReader
	RenewalReader
	BoundKeypairStore
	JoinStateCarrier
	ResyncStore
	TicketUseStore
	ReportOutbox
	DiscoveryStore
	SignerStore
	CAStore
	CARootStore
	TaskStore
	AgentStreamStore
	AgentLister
	CRLStore
	JWTKeyStore
	CustodyStore
	SettingStore
	AgentCertificateCounter
}
