package crl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// Store is the part of the store the Publisher uses.
type Store interface {
	Now(ctx context.Context) (time.Time, error)
	ListRevokedCertificates(ctx context.Context, issuedAfter time.Time) ([]store.RevokedCertificate, error)
	GetCRL(ctx context.Context, issuer string) (store.CRL, error)
	PutCRL(ctx context.Context, c store.CRL, prev store.CRL) error
	// ListLocks says when the locks in force end: a lock given a --ttl
	// leaves the lists then, and lock ends are not changes the store
	// notifies.
	ListLocks(ctx context.Context) ([]store.Lock, error)
	// ListCACerts is read when an issuer's key fails to sign: an
	// intermediate the leader retired (and whose key it destroyed) since
	// this replica last read them is skipped, not an error.
	ListCACerts(ctx context.Context) ([]store.CACert, error)
}

// Defaults and bounds of Config.
const (
	DefaultValidity = 24 * time.Hour
	// MinValidity keeps a list valid long enough to be fetched and used.
	MinValidity = 10 * time.Second
	// settle gathers the changes of one burst (a node deleted with its
	// lock, a fleet locked by a script) into one signing.
	settle = 500 * time.Millisecond
	// retryAfter is how soon a failed pass (the store unreachable) is
	// tried again.
	retryAfter = 5 * time.Second
)

// Config is what a Publisher needs.
type Config struct {
	Store Store
	// Issuers returns the issuing intermediates whose lists are kept,
	// at each pass; safe for concurrent use.
	Issuers func() []Issuer
	// Validity is nextUpdate − thisUpdate (zero: DefaultValidity).
	Validity time.Duration
	// MaxLeafTTL bounds how long ago a deleted node's last certificate can
	// have been issued and still be unexpired.
	MaxLeafTTL time.Duration
	Log        *slog.Logger
}

// Status is what the latest pass knows of one list, for metrics.
type Status struct {
	Issuer     Issuer
	Number     int64
	ThisUpdate time.Time // when it was signed (its thisUpdate is Backdate earlier)
	// NextUpdate is when relying parties stop trusting it: the list must
	// be signed anew before then.
	NextUpdate time.Time
	Entries    int
}

// Publisher keeps the lists signed and stored. Its methods are safe for
// concurrent use.
type Publisher struct {
	cfg  Config
	poke chan struct{}

	mu     sync.Mutex
	status map[string]Status
}

// New returns a Publisher; Run keeps it going.
func New(cfg Config) *Publisher {
	if cfg.Validity == 0 {
		cfg.Validity = DefaultValidity
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Publisher{cfg: cfg, poke: make(chan struct{}, 1), status: map[string]Status{}}
}

// Validity is the lifetime of the lists it signs.
func (p *Publisher) Validity() time.Duration { return p.cfg.Validity }

// Poke asks for a pass soon: something a list holds may have changed. It
// never blocks.
func (p *Publisher) Poke() {
	select {
	case p.poke <- struct{}{}:
	default:
	}
}

// Run makes a pass at once, then after each poke (once a burst settles),
// whenever a list reaches half its validity and when a lock ends, until
// ctx ends. A failed pass is tried again, and logged unless the store was
// unavailable.
func (p *Publisher) Run(ctx context.Context) error {
	for {
		next, err := p.Publish(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := time.Until(next)
		if err != nil {
			// An outage of the store is logged once by the authority, as
			// it begins and as it ends; logged here too it would be one
			// line every retryAfter on every replica for its length.
			if !errors.Is(err, store.ErrUnavailable) {
				p.cfg.Log.Error("signing the certificate revocation lists failed; trying again", "err", err)
			}
			wait = retryAfter
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-p.poke:
			t.Stop()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(settle):
			}
		}
	}
}

// Publish makes one pass over every issuer: it reads what must be revoked,
// and signs and stores a new list for each issuer whose stored list says
// something else or has passed half its validity. It returns when the
// next pass is due: the earliest half-validity of the lists, or the end of
// a lock whose entries they hold, if sooner.
func (p *Publisher) Publish(ctx context.Context) (next time.Time, err error) {
	now, err := p.cfg.Store.Now(ctx)
	if err != nil {
		return time.Time{}, err
	}
	// Read before the revoked set: a lock made after this read is a
	// change the store notifies, and pokes a pass of its own.
	lockEnds, err := p.firstLockEnd(ctx)
	if err != nil {
		return time.Time{}, err
	}
	revoked, err := p.cfg.Store.ListRevokedCertificates(ctx, now.Add(-p.cfg.MaxLeafTTL))
	if err != nil {
		return time.Time{}, err
	}
	next = now.Add(p.cfg.Validity / 2)
	if !lockEnds.IsZero() && lockEnds.Before(next) {
		next = lockEnds
	}
	live := map[string]bool{}
	var issuers []Issuer
	for _, is := range p.cfg.Issuers() {
		// An intermediate past its not-after (by the store clock, the
		// one the leader retires it by) has no valid leaf left to list,
		// and the leader destroys its key as it retires it: a pass that
		// signed with it then would fail on the key's absence (a
		// PKCS#11 token's "private object is not in the token"), in the
		// moments before this replica reads the retirement. Its list is
		// served as it is until then, and no longer counts for the
		// metrics.
		if !now.Before(is.Cert.NotAfter) {
			continue
		}
		issuers = append(issuers, is)
		live[is.Name()] = true
	}
	var errs []error
	for _, is := range issuers {
		if is.Signer == nil {
			// Its key is lost (a retiring intermediate's, docs/hsm.md
			// "A lost token"): the list last signed is served as it is
			// until its nextUpdate, never re-signed, so no pass is due
			// for it. Its status says when that list expires, for the
			// metric an alert watches.
			if err := p.keepStatus(ctx, is); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		st, err := p.publishOne(ctx, is, entriesFor(is, revoked), now)
		if errors.Is(err, errRetired) {
			// Its list is served as it is until this replica reads the
			// retirement, and no longer counts for the metrics.
			delete(live, is.Name())
			continue
		}
		if errors.Is(err, errRaced) {
			// What this pass read may be older than what the other
			// replica signed: read it all again in another pass.
			p.Poke()
			break
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if due := st.ThisUpdate.Add(p.cfg.Validity / 2); due.Before(next) {
			next = due
		}
	}
	p.mu.Lock()
	for name := range p.status {
		if !live[name] {
			delete(p.status, name)
		}
	}
	p.mu.Unlock()
	return next, errors.Join(errs...)
}

// firstLockEnd returns when the first lock in force with an end ends
// (zero if none has one), by the store clock: its entries leave the lists
// then.
func (p *Publisher) firstLockEnd(ctx context.Context) (time.Time, error) {
	locks, err := p.cfg.Store.ListLocks(ctx)
	if err != nil {
		return time.Time{}, err
	}
	var first time.Time
	for _, l := range locks {
		if !l.ExpiresAt.IsZero() && (first.IsZero() || l.ExpiresAt.Before(first)) {
			first = l.ExpiresAt
		}
	}
	return first, nil
}

// errRaced: another replica stored a list of the same issuer between this
// pass's read and its write.
var errRaced = errors.New("crl: another replica stored a list first")

// publishOne brings the stored list of is up to date: kept if it holds
// entries already and is younger than half its validity, or if it was
// signed from a read no older than this pass's (now); else signed anew
// with the next number. Losing the conditional write to another replica
// returns errRaced: its list may come from a later read than entries, so
// the pass ends rather than signing over it.
func (p *Publisher) publishOne(ctx context.Context, is Issuer, entries []entry, now time.Time) (Status, error) {
	d := digest(entries)
	stored, err := p.cfg.Store.GetCRL(ctx, is.Name())
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return Status{}, err
	}
	st := Status{Issuer: is, Number: stored.Number, ThisUpdate: stored.ThisUpdate, NextUpdate: stored.NextUpdate, Entries: len(entries)}
	if err == nil && sameBytes(stored.Digest, d) && now.Before(stored.ThisUpdate.Add(p.cfg.Validity/2)) {
		p.setStatus(st)
		return st, nil
	}
	if err == nil && !stored.ThisUpdate.Before(now) {
		// Signed by another replica from a read at least as late as this
		// one: keep it. If it says something else, a later pass decides.
		if !sameBytes(stored.Digest, d) {
			p.Poke()
		}
		p.setStatus(st)
		return st, nil
	}
	number := nextNumber(stored.Number, now)
	der, err := sign(is, number, entries, stored.DER, now, p.cfg.Validity)
	if err != nil {
		if retired, rerr := p.retired(ctx, is); rerr == nil && retired {
			p.cfg.Log.Info("not signing the certificate revocation list of an intermediate retired since this replica read the intermediates; "+
				"its last list is served until the replica reads the retirement", "issuer", is.Name(), "sign_err", err)
			return Status{}, errRetired
		}
		return Status{}, err
	}
	c := store.CRL{Issuer: is.Name(), Number: number, ThisUpdate: now, NextUpdate: now.Add(p.cfg.Validity), Digest: d, DER: der}
	err = p.cfg.Store.PutCRL(ctx, c, stored)
	if errors.Is(err, store.ErrConflict) {
		return Status{}, fmt.Errorf("%w: %s", errRaced, is.Name())
	}
	if err != nil {
		return Status{}, err
	}
	st.Number, st.ThisUpdate, st.NextUpdate = c.Number, c.ThisUpdate, c.NextUpdate
	p.setStatus(st)
	p.cfg.Log.Info("certificate revocation list signed", "issuer", is.Name(), "number", c.Number, "entries", len(entries))
	return st, nil
}

// nextNumber is the number of the list signed at now after the stored
// one: above the stored number, and at least now in Unix seconds. The
// stored number alone goes back when the store is restored from an older
// backup, and relying parties ignore a list whose number is not above one
// they hold (RFC 5280, 5.2.3). A list is signed at most about once a
// second per issuer, so every number published is at most the second it
// was signed in (plus the replicas' clock skew): a list signed after a
// restore numbers above every list published before it. The clock is
// shared by all replicas, where a witness file would be per replica.
func nextNumber(stored int64, now time.Time) int64 {
	return max(stored+1, now.Unix())
}

// errRetired: the issuer's key failed to sign, and the store says the
// intermediate is retired: the leader retired it before its not-after (its
// last leaf expired, or it was a prepared one discarded) and destroyed its
// key, and this replica has not read that yet.
var errRetired = errors.New("crl: the issuing intermediate is retired")

// retired reports whether the store holds is as retired: its key is
// destroyed or about to be, so a failed signature is no fault (one the
// store does not hold is not retired, below). Read only after a signature failed, so a pass costs no more.
func (p *Publisher) retired(ctx context.Context, is Issuer) (bool, error) {
	rows, err := p.cfg.Store.ListCACerts(ctx)
	if err != nil {
		return false, err
	}
	serial := is.Cert.SerialNumber.Text(16)
	for _, r := range rows {
		if r.Serial == serial {
			return r.State == store.CARetired, nil
		}
	}
	// Not in the store: an intermediate of the data directory, read
	// before the store's; its key is never destroyed by a retirement.
	return false, nil
}

// keepStatus sets the status of is, which cannot sign, from its stored
// list: none stored leaves it out.
func (p *Publisher) keepStatus(ctx context.Context, is Issuer) error {
	stored, err := p.cfg.Store.GetCRL(ctx, is.Name())
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	entries, err := countEntries(stored.DER)
	if err != nil {
		return fmt.Errorf("crl: the stored list of %s: %w", is.Name(), err)
	}
	p.setStatus(Status{Issuer: is, Number: stored.Number, ThisUpdate: stored.ThisUpdate, NextUpdate: stored.NextUpdate, Entries: entries})
	return nil
}

func (p *Publisher) setStatus(st Status) {
	p.mu.Lock()
	p.status[st.Issuer.Name()] = st
	p.mu.Unlock()
}

// Statuses returns what the latest pass knew of each list still served:
// an intermediate retired or discarded since leaves at once, as Get
// answers ErrUnknownIssuer for it, not at the next pass (before, the
// metric named a list for about a second after it returned 404).
func (p *Publisher) Statuses() []Status {
	live := map[string]bool{}
	for _, is := range p.cfg.Issuers() {
		live[is.Name()] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Status, 0, len(p.status))
	for name, st := range p.status {
		if live[name] {
			out = append(out, st)
		}
	}
	return out
}

// Get returns the stored list called name (ROLE-SERIAL) in DER;
// ErrUnknownIssuer if no current issuing intermediate has that name, an
// error wrapping store.ErrNotFound if its first list is not signed yet.
func (p *Publisher) Get(ctx context.Context, name string) (store.CRL, error) {
	known := false
	for _, is := range p.cfg.Issuers() {
		if is.Name() == name {
			known = true
			break
		}
	}
	if !known {
		return store.CRL{}, ErrUnknownIssuer
	}
	return p.cfg.Store.GetCRL(ctx, name)
}
