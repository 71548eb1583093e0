package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of the join and renewal writes. Each names the one
// condition that failed, so the service layer can answer with the code
// DESIGN.md gives it without a second read.
var (
	// ErrTokenSpent: the token is expired or has no use left, by the store
	// clock, at the moment of the conditional write.
	ErrTokenSpent = errors.New("store: token expired or used up")
	// ErrNodeTaken: the node ID is held by another instance and the join
	// may not supersede it.
	ErrNodeTaken = errors.New("store: node ID already exists")
	// ErrLocked: a lock is in force, by the store clock at the moment of
	// the conditional write, on one of the write's LockTargets. The error
	// is a *LockedError naming the lock.
	ErrLocked = errors.New("store: locked")
)

// LockedError is the refusal of a join or renewal write by a lock in
// force on one of its LockTargets: the one FindAnyLock would return for
// them. errors.Is(err, ErrLocked) holds for it.
type LockedError struct{ Lock Lock }

func (e *LockedError) Error() string {
	return "store: locked by " + e.Lock.ID + " on " + e.Lock.Kind + " " + e.Lock.Target
}

func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// Join methods.
const (
	JoinMethodToken        = "token"
	JoinMethodPSK          = "psk"
	JoinMethodBoundKeypair = "bound-keypair"
)

// Token is one join token. The secret is kept only sealed (Ciphertext and
// Nonce, with the token ID as additional data).
type Token struct {
	ID          string
	JoinMethod  string
	Ciphertext  []byte
	Nonce       []byte
	UsesAllowed int64 // 0: unlimited until expiry
	UsesCount   int64
	ExpiresAt   time.Time // zero: never expires
	NodeID      string    // the node the token is bound to, or ""
	Description string
	Labels      map[string]string
	CreatedBy   string
	CreatedAt   time.Time
	LastUsedAt  time.Time
	// BoundKeypair is the spec and status of a bound-keypair token, nil
	// for other join methods. InsertToken writes it with the token.
	BoundKeypair *BoundKeypair
	// SVIDUsage is what the certificates of the token's joins may be used
	// for: "" (client authentication only, stored as SVIDUsageClient) or
	// SVIDUsageClientServer.
	SVIDUsage string
}

// SVID usages of a token (docs/workload-api.md).
const (
	SVIDUsageClient       = "client"
	SVIDUsageClientServer = "client,server"
)

// SVIDUsageOrDefault is t.SVIDUsage, SVIDUsageClient when unset.
func (t Token) SVIDUsageOrDefault() string {
	if t.SVIDUsage == "" {
		return SVIDUsageClient
	}
	return t.SVIDUsage
}

// Instance states. A lock is not a state: it is a separate deny rule.
const (
	InstanceCurrent    = "current"
	InstanceSuperseded = "superseded"
	InstanceDeleted    = "deleted"
)

// Node is one admitted machine: the holder of a node ID. It lives from its
// first join until an operator deletes it.
type Node struct {
	ID         string
	JoinMethod string // method of the current instance's join
	TokenID    string // token of the current instance's join, if any
	InstanceID string // the current instance
	CreatedAt  time.Time
	UpdatedAt  time.Time // last join or supersession
}

// Instance is one continuous identity of a node.
type Instance struct {
	ID         string
	NodeID     string
	JoinMethod string
	TokenID    string
	PreviousID string // the instance this one superseded, or ""
	State      string
	Generation int64 // renewals so far; the join issues generation 0
	CreatedAt  time.Time
	// The last certificate issued to the instance, kept to answer a retry
	// of the request that produced it.
	LastSerial    string
	LastPublicKey []byte // SHA-256 of the certified SubjectPublicKeyInfo
	LastChainPEM  []byte
	LastIssuedAt  time.Time
}

// Certificate is the record of one certificate issued to a node.
type Certificate struct {
	Serial     string // lower-case hex, unique
	NodeID     string
	InstanceID string
	Generation int64
	JoinMethod string
	TokenID    string
	PublicKey  []byte // SHA-256 of the SubjectPublicKeyInfo
	NotBefore  time.Time
	NotAfter   time.Time
	IssuedAt   time.Time
}

// Join is everything one admission writes.
type Join struct {
	// TokenID is the token whose use this is; "" for methods without one.
	TokenID string
	// Credential names the proof of a join that uses no token (a bootstrap
	// PSK's ID); it is recorded as the instance's and certificate's
	// TokenID, no token is used, and the retry check matches it. At most
	// one of TokenID and Credential is set.
	Credential string
	NodeID     string
	// MaySupersede lets the join replace the node's current instance (a
	// token bound to this node: deliberate re-provisioning). Otherwise a
	// held node ID fails with ErrNodeTaken.
	MaySupersede bool
	// NodeFreeAtRead says the caller's read (ReadJoin) found no node
	// with NodeID, so the write may take the ID as free instead of reading
	// it again. It is a guess the write checks, never trusts: the node's
	// INSERT fails if a join took the ID since, and any other refusal
	// reads the node. A wrong guess writes nothing of it and the write is
	// made again reading the node, so the outcome is the one the join
	// would have without it (a retry, a supersession, ErrNodeTaken).
	NodeFreeAtRead bool
	// RetryWindow: if the node's current instance was created by this
	// token (or Credential) within the window, is still at generation 0, and certified the
	// same public key, the join is a retry of a lost reply: nothing is
	// written and that instance is returned with Retry set.
	RetryWindow time.Duration
	// Ticket, if set, is the referral ticket the join used: its use, and
	// the join's pending report to discovery (see ReportOutbox), are
	// recorded in the same transaction, and a jti recorded already fails
	// the join with ErrTicketReplayed. A retry (see RetryWindow) records
	// nothing and is not refused for its ticket.
	Ticket *TicketUse
	// LockTargets are the targets whose locks the caller's read checked
	// (empty ones are skipped): a lock in force on any of them by the
	// store clock refuses the join in its write (*LockedError), before
	// the retry check, so one created between the read and the write
	// stops it.
	LockTargets []LockTarget
	// Claims are the join method's further conditions (see Claim), applied
	// after the token's and the ticket's use; the token and the ticket are
	// named by TokenID and Ticket, never here.
	Claims []Claim
	// Instance is the new instance: ID, JoinMethod, TokenID, CreatedAt and
	// the Last* fields of its first certificate. NodeID, State, PreviousID
	// and Generation are set by CommitJoin.
	Instance    Instance
	Certificate Certificate
	// Audit, if set, builds the audit record of the join, appended to the
	// chain in the same transaction (see AppendAudit). It is not called
	// for a retry, which writes nothing.
	Audit func(head AuditHead) (AuditRecord, error)
}

// JoinResult reports what CommitJoin did.
type JoinResult struct {
	Instance Instance
	// Retry: the join repeated an earlier one; nothing was written.
	Retry bool
	// Superseded is the ID of the instance this join replaced, or "".
	Superseded string
}

// Renewal is one certificate issued to an existing instance.
type Renewal struct {
	InstanceID string
	// FromGeneration is the generation of the certificate presented; the
	// write succeeds only if the instance is still current at it.
	FromGeneration int64
	Certificate    Certificate // Generation is FromGeneration+1
	ChainPEM       []byte
	// LockTargets are the targets whose locks the caller's read checked
	// (RenewalLockTargets, and a refresh's join targets; empty ones are
	// skipped): a lock in force on any of them by the store clock refuses
	// the renewal in its conditional write (*LockedError), so one created
	// between the read and the write stops it.
	LockTargets []LockTarget
	// Claims are further conditions won in the renewal's write (a key
	// rotation on a refresh); a failed one fails the renewal.
	Claims []Claim
	// Audit, if set, builds the audit record of the renewal, appended to
	// the chain in the same transaction.
	Audit func(head AuditHead) (AuditRecord, error)
}

// CarriedIdentity is a node's current instance and the record of its
// last certificate as the store a restore from a backup replaced holds
// them, carried to the restored store (store reapply) so that an agent
// that renewed or joined since the backup renews by itself.
type CarriedIdentity struct {
	// Instance is the instance carried, current; its Generation and
	// Last* fields are its last certificate's, Certificate.
	Instance    Instance
	Certificate Certificate
	// Held is the instance as the restored store holds it, as read: the
	// write advances it only while it is still so (current, at that
	// generation and last serial). Nil for a node that joined since the
	// backup: Node and the instance are inserted, only while neither ID
	// is held.
	Held *Instance
	// Node is the node to insert with a Held nil, as the store kept
	// aside holds it (its CreatedAt kept: DeleteNodeCreated matches it).
	Node Node
}

// RetiredIdentity is an instance that the store a restore replaced holds
// deleted or superseded, with the certificate records issued to it that
// the restored store lacks, carried (store reapply) so that the restored
// store refuses it as that store did and its CRL names, for a deleted
// node, every certificate it got since the backup. Carrying it only ever
// takes an identity out: the instance is written non-current.
type RetiredIdentity struct {
	// Instance is the instance as the store kept aside holds it:
	// deleted or superseded, its Generation and Last* fields its last
	// certificate's, Last.
	Instance Instance
	Last     Certificate
	// Certificates are its records the restored store lacks, inserted.
	Certificates []Certificate
	// Held is the instance as the restored store holds it, as read: the
	// write moves it only while it is still at that generation and last
	// serial (in whatever state: a node deletion re-applied before may
	// have deleted it), never to an older generation. Nil for an
	// instance made since the backup: it is inserted, only while its ID
	// is free, with no node.
	Held *Instance
}

// Check refuses a retired identity whose parts disagree: a current
// instance, a last record not the instance's, a record of another
// instance, or a held instance that is another's.
func (r RetiredIdentity) Check() error {
	in := r.Instance
	switch {
	case in.State != InstanceDeleted && in.State != InstanceSuperseded:
		return fmt.Errorf("retired instance %s is %s, not deleted or superseded", in.ID, in.State)
	case r.Last.Serial == "" || r.Last.Serial != in.LastSerial || r.Last.InstanceID != in.ID:
		return fmt.Errorf("certificate %s is not retired instance %s's last (%s)", r.Last.Serial, in.ID, in.LastSerial)
	case r.Held != nil && r.Held.ID != in.ID:
		return fmt.Errorf("retired instance %s is not the held instance %s", in.ID, r.Held.ID)
	}
	for _, c := range r.Certificates {
		if c.InstanceID != in.ID || c.NodeID != in.NodeID {
			return fmt.Errorf("certificate %s is of node %s, instance %s, not retired instance %s of node %s", c.Serial, c.NodeID, c.InstanceID, in.ID, in.NodeID)
		}
	}
	return nil
}

// JoinStore is the part of the store that admits and renews nodes. Every
// method that must happen once is one transaction whose conditions are
// checked against the store clock inside it.
type JoinStore interface {
	// InsertToken adds a token; ErrConflict if its ID exists. audit
	// builds its record (token.create), appended to the chain in the
	// same transaction (see AppendAudit): the token can admit nodes only
	// once its record is in. An error building or appending it is
	// returned and nothing is written; a nil audit is refused.
	InsertToken(ctx context.Context, t Token, audit func(head AuditHead) (AuditRecord, error)) error
	// GetToken returns a token, expired or not; ErrNotFound.
	GetToken(ctx context.Context, id string) (Token, error)
	// ListTokens returns every token, oldest first.
	ListTokens(ctx context.Context) ([]Token, error)
	// ListTokensPage returns up to limit tokens that come after the key in
	// ListTokens' order (CreatedAt, then ID); the zero key starts at the
	// first. A keyset, not an offset: a token inserted or deleted between
	// two pages neither shifts nor repeats the others.
	ListTokensPage(ctx context.Context, after TokenKey, limit int) ([]Token, error)
	// CountTokens counts the tokens by their state at now (the states of
	// jointoken.Usage: expired first, then used up, else active), in the
	// store, without reading them out: the muster_tokens gauge at every
	// scrape, at a million tokens.
	CountTokens(ctx context.Context, now time.Time) (TokenCounts, error)
	// DeleteToken removes a token; ErrNotFound. Nodes it admitted keep
	// their identities. audit builds its record (token.delete), appended
	// in the same transaction as InsertToken's: an error building or
	// appending it is returned and the token stays; a nil audit is
	// refused.
	DeleteToken(ctx context.Context, id string, audit func(head AuditHead) (AuditRecord, error)) error
	// RaiseTokenUses brings the use count of a token of limited uses up
	// to uses (never past its allowed uses, never down), with the record
	// audit builds appended in the same transaction: the uses a store
	// restored from a backup forgot, taken again, so a single-use token
	// spent since the backup admits no one. ErrNotFound if the token is
	// gone; ErrConflict, nothing written, if it has unlimited uses (no
	// count refuses a join) or counts uses already. A nil audit is
	// refused.
	RaiseTokenUses(ctx context.Context, id string, uses int64, audit func(head AuditHead) (AuditRecord, error)) error
	// DeleteExpiredTokens removes tokens that expired more than retention
	// ago by the store clock and returns their IDs. Bound-keypair tokens
	// are left alone: only an operator deletes them.
	// When it deletes any, audit(ids) builds their record
	// (token.cleanup), appended in the same transaction (see
	// AppendAudit): an error building or appending it is returned and
	// the tokens stay (expired, they admit no one). When it deletes none,
	// audit is not called and nothing is appended. A nil audit is
	// refused.
	DeleteExpiredTokens(ctx context.Context, retention time.Duration, audit func(ids []string) func(head AuditHead) (AuditRecord, error)) ([]string, error)

	// CommitJoin performs one admission as a single transaction: the retry
	// check (by TokenID, else Credential); each claim of j.AllClaims(), in
	// order (TokenUse: ErrTokenSpent if the token is expired or used up by
	// the store clock, ErrNotFound if it is gone; TicketUse:
	// ErrTicketReplayed); the node ID claim (ErrNodeTaken, or supersession
	// when allowed); the new instance; the certificate record; if Ticket is
	// set, the join's pending report (PendingReport: JoinedAt is the
	// instance's CreatedAt). First of all, a lock in force on any of
	// j.LockTargets refuses it (*LockedError, ErrLocked). On any error
	// nothing is written.
	CommitJoin(ctx context.Context, j Join) (JoinResult, error)
	// CommitRenewal advances an instance from FromGeneration to
	// FromGeneration+1 and records the certificate, only if the instance
	// is current and at FromGeneration and no lock is in force on any of
	// r.LockTargets; else ErrConflict (or *LockedError, ErrLocked) and
	// nothing is written (the caller re-reads the instance to tell a retry
	// from a copy). ErrNotFound if there is no such instance.
	CommitRenewal(ctx context.Context, r Renewal) (Instance, error)

	// GetNode returns a node; ErrNotFound.
	GetNode(ctx context.Context, id string) (Node, error)
	// MissingNodes returns those of ids that name no node, in the order
	// given, in one query (a task addressed to a thousand nodes checks
	// them at once, not with a thousand reads).
	MissingNodes(ctx context.Context, ids []string) ([]string, error)
	// NodesWithLabels returns the IDs of the nodes whose current
	// instance's join token, while it exists, carries every one of labels
	// (a label selector; a node whose token is gone is selected by none),
	// ordered by ID, in one query (not one token read per node).
	NodesWithLabels(ctx context.Context, labels map[string]string) ([]string, error)
	// ListNodes returns every node, ordered by ID.
	ListNodes(ctx context.Context) ([]Node, error)
	// DeleteNode removes a node and its stream row (AgentStreamStore)
	// and marks its current instance deleted, freeing the node ID;
	// ErrNotFound. audit builds its record
	// (agent.delete), appended in the same transaction (see AppendAudit):
	// an error building or appending it is returned and the node stays;
	// a nil audit is refused.
	DeleteNode(ctx context.Context, id string, audit func(head AuditHead) (AuditRecord, error)) error
	// DeleteNodeCreated is DeleteNode of the node id first joined at
	// created (Node.CreatedAt; a node keeps it through its instances'
	// supersessions) only: a node deleted and joined again under its ID
	// since is another node, and is left, ErrConflict, nothing written.
	// ErrNotFound if no node holds id; a zero created is refused.
	DeleteNodeCreated(ctx context.Context, id string, created time.Time, audit func(head AuditHead) (AuditRecord, error)) error
	// CarryIdentity writes c to the restored store in one transaction,
	// with the record audit builds (store.reapply): for c.Held, the
	// instance advanced to c.Instance's generation and last certificate,
	// only while it is current and still at c.Held's generation and last
	// serial, and c.Instance's generation is above it; else the node, the
	// instance and the certificate record inserted, only while no node
	// holds the node ID and no instance the instance ID. ErrConflict,
	// nothing written, when a condition fails or the certificate's serial
	// is recorded already; ErrNotFound if c.Held's instance is gone. A
	// nil audit is refused.
	CarryIdentity(ctx context.Context, c CarriedIdentity, audit func(head AuditHead) (AuditRecord, error)) error
	// RetireIdentity writes r to the restored store in one transaction,
	// with the record audit builds (store.reapply): r.Certificates
	// inserted, and for r.Held the instance moved to r.Instance's state,
	// generation and last certificate, only while it is at r.Held's
	// generation and last serial and r.Instance's generation is not
	// below it; else the instance inserted (no node), only while its ID
	// is free. ErrConflict, nothing written, when a condition fails, a
	// serial is recorded already, or nothing would change; ErrNotFound if
	// r.Held's instance is gone. A nil audit is refused.
	RetireIdentity(ctx context.Context, r RetiredIdentity, audit func(head AuditHead) (AuditRecord, error)) error
	// GetInstance returns an instance; ErrNotFound.
	GetInstance(ctx context.Context, id string) (Instance, error)
	// ListInstances returns the instances of a node ID, oldest first,
	// including those of deleted nodes that held the ID.
	ListInstances(ctx context.Context, nodeID string) ([]Instance, error)
	// GetCertificate returns the record of a serial; ErrNotFound.
	GetCertificate(ctx context.Context, serial string) (Certificate, error)
	// ListCertificates returns the certificates issued under a node ID,
	// oldest first.
	ListCertificates(ctx context.Context, nodeID string) ([]Certificate, error)
}

// Check refuses a carried identity whose parts disagree: its certificate
// record is not the instance's last, or the node or held instance is
// another's.
func (c CarriedIdentity) Check() error {
	in, cert := c.Instance, c.Certificate
	switch {
	case cert.Serial == "" || cert.Serial != in.LastSerial:
		return fmt.Errorf("carried certificate %s is not instance %s's last (%s)", cert.Serial, in.ID, in.LastSerial)
	case cert.InstanceID != in.ID || cert.NodeID != in.NodeID || cert.Generation != in.Generation:
		return fmt.Errorf("carried certificate %s is of node %s, instance %s, generation %d, not node %s, instance %s, generation %d",
			cert.Serial, cert.NodeID, cert.InstanceID, cert.Generation, in.NodeID, in.ID, in.Generation)
	case c.Held != nil && c.Held.ID != in.ID:
		return fmt.Errorf("carried instance %s is not the held instance %s", in.ID, c.Held.ID)
	case c.Held == nil && (c.Node.ID != in.NodeID || c.Node.InstanceID != in.ID || c.Node.CreatedAt.IsZero()):
		return fmt.Errorf("carried node %s (instance %s) is not instance %s's node %s, or has no creation time", c.Node.ID, c.Node.InstanceID, in.ID, in.NodeID)
	}
	return nil
}
