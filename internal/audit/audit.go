// Package audit is the authority's audit log: a chain of records, each
// bound to the one before it by a keyed hash, whose head is signed at
// intervals.
//
// The chain key and the checkpoint signing key live outside the store. So
// someone who can write the database but not read those keys cannot edit,
// insert, remove or reorder a record, nor rebuild the whole chain, without
// Verify naming the first record that is wrong: the chain catches everything
// but a cut tail, and the signed checkpoints, also kept in a file outside the
// database, catch the cut tail.
package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// Results of an audited action.
const (
	ResultOK     = "ok"
	ResultDenied = "denied"
	ResultError  = "error"
)

// ErrInvalidEvent is returned by Record for an event that cannot be
// recorded; nothing is written.
var ErrInvalidEvent = errors.New("audit: invalid event")

// Event is what happened, as the caller tells it; Record adds the sequence
// number, the time and the hashes.
type Event struct {
	Actor         string
	Action        string
	Target        string
	Result        string
	Reason        string
	Source        string
	CorrelationID string
}

// Store is the part of store.Store the audit log needs.
type Store interface {
	AppendAudit(ctx context.Context, build func(store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error)
	AuditHead(ctx context.Context) (store.AuditHead, error)
	ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditRecord, error)
	InsertAuditCheckpoint(ctx context.Context, c store.AuditCheckpoint) error
	ListAuditCheckpoints(ctx context.Context) ([]store.AuditCheckpoint, error)
}

// Config configures a Logger.
type Config struct {
	Store Store
	// ChainKey keys the record hashes. It must be at least 32 bytes and must
	// not be kept in the store, or whoever writes the store can rebuild the
	// chain.
	ChainKey []byte
	// CheckpointKey signs checkpoints; like ChainKey it is kept outside the
	// store.
	CheckpointKey ed25519.PrivateKey
	// CheckpointFile, if set, receives a copy of the latest checkpoint, so
	// that removing records from the tail and the checkpoints that cover
	// them from the store is still caught.
	CheckpointFile string
	// Now is the clock of record and checkpoint times; time.Now if nil.
	Now func() time.Time
	// CheckpointInterval is how often Run checkpoints; one minute if zero.
	CheckpointInterval time.Duration
	// OnAppend, if set, is called after each record is appended.
	OnAppend func(Event)
	// HeadFile, if set, is rewritten after each append with the newest
	// record's seq and hash (head.go), so records removed from the tail
	// before the next checkpoint are still caught.
	HeadFile string
	// LockFile, if set, is flock(2)ed around each write of CheckpointFile
	// and HeadFile (filelock.go), so that several processes sharing them
	// (an authority and an offline command on one data directory) never
	// move either back.
	LockFile string
	// Log receives what cannot be returned (a head file write that
	// failed after its record was stored); slog.Default() if nil.
	Log *slog.Logger
}

// Logger appends to the audit chain, checkpoints it and verifies it. It is
// safe for concurrent use, also by several processes on one store: the
// store serializes appends and rejects duplicate checkpoints.
type Logger struct {
	st       Store
	chainKey []byte
	signKey  ed25519.PrivateKey
	pub      ed25519.PublicKey
	keyID    string
	file     string
	lock     string // Config.LockFile
	now      func() time.Time
	interval time.Duration
	onAppend func(Event)
	head     *headFile // nil without a HeadFile
	log      *slog.Logger
	// verifyCmd walks this chain from its data directory
	// (SetVerifyCommand): the first step out of a damaged head file.
	verifyCmd string
	// restoreDoc names where a restore's consequences are written
	// (SetRestoreDoc); "" for none.
	restoreDoc string

	// cpMu serializes Checkpoint, so that the file is written by one call at
	// a time and last only moves forward.
	cpMu sync.Mutex
	// last is the newest checkpoint known to be signed by this key; valid
	// once lastLoaded.
	last       store.AuditCheckpoint
	lastLoaded bool

	// macs holds HMAC-SHA256 states keyed with chainKey, reset before each
	// use: a new one per record was half the allocations of hashing it.
	macs sync.Pool
}

// New returns a Logger for cfg.
func New(cfg Config) (*Logger, error) {
	if cfg.Store == nil {
		return nil, errors.New("audit: no store")
	}
	if len(cfg.ChainKey) < 32 {
		return nil, fmt.Errorf("audit: chain key is %d bytes, want at least 32", len(cfg.ChainKey))
	}
	if len(cfg.CheckpointKey) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("audit: checkpoint key is %d bytes, want %d", len(cfg.CheckpointKey), ed25519.PrivateKeySize)
	}
	// An ed25519.PrivateKey carries its public half; one that does not match
	// the seed would sign checkpoints that never verify.
	if !bytes.Equal(ed25519.NewKeyFromSeed(cfg.CheckpointKey.Seed()), cfg.CheckpointKey) {
		return nil, errors.New("audit: checkpoint key is inconsistent: its public half does not match its seed")
	}
	if cfg.CheckpointInterval < 0 {
		return nil, fmt.Errorf("audit: negative checkpoint interval %v", cfg.CheckpointInterval)
	}
	l := &Logger{
		st:       cfg.Store,
		chainKey: bytes.Clone(cfg.ChainKey),
		signKey:  bytes.Clone(cfg.CheckpointKey),
		file:     cfg.CheckpointFile,
		lock:     cfg.LockFile,
		now:      cfg.Now,
		interval: cfg.CheckpointInterval,
		onAppend: cfg.OnAppend,
		log:      cfg.Log,
	}
	if cfg.HeadFile != "" {
		l.head = &headFile{path: cfg.HeadFile, lock: cfg.LockFile}
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	l.pub = l.signKey.Public().(ed25519.PublicKey)
	l.keyID = KeyID(l.pub)
	if l.now == nil {
		l.now = time.Now
	}
	if l.interval == 0 {
		l.interval = time.Minute
	}
	l.macs.New = func() any { return hmac.New(sha256.New, l.chainKey) }
	return l, nil
}

// Record appends e to the chain and returns the record as stored.
func (l *Logger) Record(ctx context.Context, e Event) (store.AuditRecord, error) {
	build, err := l.Builder(e)
	if err != nil {
		return store.AuditRecord{}, err
	}
	rec, err := l.st.AppendAudit(ctx, build.Build)
	if err != nil {
		return store.AuditRecord{}, fmt.Errorf("audit: record %s: %w", e.Action, err)
	}
	l.noteAppended(rec.Seq, rec.Hash)
	if l.onAppend != nil {
		l.onAppend(e)
	}
	return rec, nil
}

// Builder returns the next link of the chain for e, for a store write that
// appends the record in the same transaction as the state change it records
// (a join, a renewal): then the change and its record are durable together
// or not at all. Pass the link's Build to the write and call Appended once
// that write has committed.
func (l *Logger) Builder(e Event) (*Link, error) {
	if e.Action == "" {
		return nil, fmt.Errorf("%w: no action", ErrInvalidEvent)
	}
	switch e.Result {
	case ResultOK, ResultDenied, ResultError:
	default:
		return nil, fmt.Errorf("%w: result %q is not %q, %q or %q",
			ErrInvalidEvent, e.Result, ResultOK, ResultDenied, ResultError)
	}
	return NewLink(e, func(head store.AuditHead) (store.AuditRecord, error) {
		// The time is read when the record is built, after the record
		// it follows was (a store builds on a head it read under the
		// chain's lock, or on a record it built itself and inserts only
		// if that is still the head), so record times never go backwards
		// along the chain as long as the clock does not.
		r := store.AuditRecord{
			Seq:           head.Seq + 1,
			Time:          l.now().Truncate(time.Microsecond).UTC(),
			Actor:         e.Actor,
			Action:        e.Action,
			Target:        e.Target,
			Result:        e.Result,
			Reason:        e.Reason,
			Source:        e.Source,
			CorrelationID: e.CorrelationID,
			PrevHash:      head.Hash,
		}
		m := l.macs.Get().(hash.Hash)
		m.Reset()
		r.Hash = chainHash(m, r)
		l.macs.Put(m)
		return r, nil
	}), nil
}

// Link is one record to be appended by a store write (Logger.Builder). It
// remembers the record it built last: the store calls Build inside the
// transaction that commits (again if a batch is retried record by record),
// so once the write has committed that record is the one in the chain, and
// the head file is noted without reading the head back from the store.
type Link struct {
	e     Event
	build func(store.AuditHead) (store.AuditRecord, error)
	built store.AuditRecord
}

// NewLink returns a link that builds e's record with build; Logger.Builder
// makes the chain's, another Auditor its own.
func NewLink(e Event, build func(store.AuditHead) (store.AuditRecord, error)) *Link {
	return &Link{e: e, build: build}
}

// Event is the event the link records.
func (k *Link) Event() Event { return k.e }

// Build makes the record that follows head. The store may call it more
// than once, on a guessed head, outside the chain's lock; not safe for
// concurrent use.
func (k *Link) Build(head store.AuditHead) (store.AuditRecord, error) {
	r, err := k.build(head)
	if err == nil {
		k.built = r
	}
	return r, err
}

// Appended reports that the write carrying k committed: the head file
// notes k's record and the append is counted as Record counts it; a link
// the write never built (a repeated join) appended nothing and notes nothing.
func (l *Logger) Appended(k *Link) {
	if k.built.Seq == 0 {
		return // never built: the write appended nothing
	}
	l.noteAppended(k.built.Seq, k.built.Hash)
	if l.onAppend != nil {
		l.onAppend(k.e)
	}
}

// ChainHash is the hash of r: HMAC-SHA256 under key over every field of r
// but Hash, including PrevHash, which is what chains the records. Each field
// is prefixed with its length, so no two different records hash the same
// input by shifting bytes from one field into the next.
func ChainHash(key []byte, r store.AuditRecord) []byte {
	return chainHash(hmac.New(sha256.New, key), r)
}

// chainHash is ChainHash with m, a fresh (or reset) HMAC-SHA256 under the
// chain key.
func chainHash(m hash.Hash, r store.AuditRecord) []byte {
	fields := [...]string{r.Actor, r.Action, r.Target, r.Result, r.Reason, r.Source, r.CorrelationID}
	// The HMAC's input is written into one buffer and hashed in one Write:
	// a field written on its own would be a []byte conversion (and an
	// allocation) each, as Write is an interface call.
	n := 2*(8+8) + 8 + len(r.PrevHash)
	for _, f := range fields {
		n += 8 + len(f)
	}
	b := make([]byte, 0, n)
	b = binary.BigEndian.AppendUint64(b, 8)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Seq))
	b = binary.BigEndian.AppendUint64(b, 8)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Time.UnixMicro()))
	for _, f := range fields {
		b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		b = append(b, f...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(r.PrevHash)))
	b = append(b, r.PrevHash...)
	m.Write(b)
	return m.Sum(make([]byte, 0, sha256.Size))
}
