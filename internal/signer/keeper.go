package signer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/retrywait"
	"github.com/muster-dev/muster/internal/store"
)

// Store is the part of the store the keeper needs.
type Store interface {
	Now(ctx context.Context) (time.Time, error)
	ListSigners(ctx context.Context) ([]store.Signer, store.SignerSetID, error)
	SignerSetID(ctx context.Context) (store.SignerSetID, error)
	ApplySignerChanges(ctx context.Context, expect store.SignerSetID, changes []store.SignerChange, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error)
	AdvanceSignerSet(ctx context.Context, expect store.SignerSetID, to int64, set []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error
	DropSignerKey(ctx context.Context, versionID string, ref []byte, audit func(store.AuditHead) (store.AuditRecord, error)) error
	PutVerifierSet(ctx context.Context, id store.SignerSetID, raw []byte) error
	VerifierSets(ctx context.Context, after int64, limit int) ([]store.PublishedSet, error)
}

// Auditor writes the audit trail; *audit.Logger is one. Record appends a
// refusal's record on its own; Builder and Appended write a change's
// record in the same store transaction as the change (every step, advance
// and key destruction: the signers never change unaudited).
type Auditor interface {
	Record(ctx context.Context, e audit.Event) (store.AuditRecord, error)
	Builder(e audit.Event) (*audit.Link, error)
	Appended(link *audit.Link)
}

// ChangedConcurrently is the refusal of a step that lost a race (store.
// ErrConflict): another operator or replica changed the signers between
// its read and its write. The operator's answer and the step's audit
// record both say it, with the way out: the step planned from signers
// that are no longer there, and may mean something else now (a second
// rollback discards the rotation the first one restored).
const ChangedConcurrently = "the signers changed concurrently (another operator or replica took a step first); run muster signer list and try again"

// Actor is who asks for a lifecycle step, as the audit records it.
type Actor struct{ Name, Source, CorrelationID string }

// Keeper runs the signer lifecycle against the store: it reads the
// signers, plans a step by the table, and writes it as one conditional
// change set with its node_task_signer.<action> record (a refusal is
// audited after). Times are the
// store's clock, so every replica decides alike. Safe for concurrent use;
// of two replicas taking the same step, one writes and the other gets
// store.ErrConflict.
type Keeper struct {
	st          Store
	custody     Custody
	audit       Auditor
	authorityID string
	// leftModule is the PKCS#11 library of a token this keeper does not
	// open (WithLeftModule), named in the commands its records give to
	// delete that token's keys by hand.
	leftModule string
	// minLead is signer.min_lead_time, a time.Duration: a shared setting
	// the authority changes while the keeper runs (UseMinLeadTime).
	minLead atomic.Int64

	// signed is the last verifier set this keeper signed, by set ID. Every
	// join, renewal and recovery answer carries the set; signing it afresh
	// each time cost a store transaction and a signature per request.
	signed atomic.Pointer[cachedSet]
}

// cachedSet is one signed verifier set and the ID of the signer rows it
// was made from; raw is shared by every caller and never modified.
type cachedSet struct {
	id  store.SignerSetID
	raw []byte
}

// NewKeeper returns a keeper. minLead <= 0 means DefaultMinLeadTime.
func NewKeeper(st Store, custody Custody, a Auditor, authorityID string, minLead time.Duration) *Keeper {
	k := &Keeper{st: st, custody: custody, audit: a, authorityID: authorityID}
	k.UseMinLeadTime(minLead)
	return k
}

// WithLeftModule tells k the PKCS#11 library of a token whose keys it
// does not open (muster ca migrate-custody --rollback: the module the
// store recorded), so that a key it leaves there is named with commands
// that run pasted, not with MODULE. It returns k; call it before k is
// used.
func (k *Keeper) WithLeftModule(module string) *Keeper {
	k.leftModule = module
	return k
}

// UseMinLeadTime makes minLead (<= 0: DefaultMinLeadTime) the lead time
// of the steps taken and the verifier sets signed from now on; a set
// already kept keeps the lead time it carries, and agents learn the new
// one with the next signer step's set. Safe for concurrent use.
func (k *Keeper) UseMinLeadTime(minLead time.Duration) {
	k.minLead.Store(int64(MinLeadTimeFor(minLead)))
}

// MinLeadTimeFor is signer.min_lead_time in force for a configured value:
// the value, or DefaultMinLeadTime when it is not set (<= 0). The keeper
// and --check-config both ask here, so what check-config prints is what
// runs.
func MinLeadTimeFor(configured time.Duration) time.Duration {
	if configured <= 0 {
		return DefaultMinLeadTime
	}
	return configured
}

// MinLeadTime is signer.min_lead_time.
func (k *Keeper) MinLeadTime() time.Duration { return time.Duration(k.minLead.Load()) }

// Snapshot is the signers, the verifier set version and the store clock,
// read together.
type Snapshot struct {
	Signers []Signer
	refs    map[string][]byte
	// set identifies the rows read (the version and the step's time).
	set store.SignerSetID
	Now time.Time
}

// Version is the version of the signer set read.
func (s Snapshot) Version() int64 { return s.set.Version }

// KeyCustody names where the private key of versionID lives: "sealed" (in
// the store) or the pkcs11: URI of its token object; "destroyed" once it
// is gone. An ended signer still naming a URI has a token object the
// leader has yet to destroy (the token did not answer).
func (s Snapshot) KeyCustody(versionID string) string {
	if ref := s.refs[versionID]; len(ref) > 0 {
		return Where(ref)
	}
	return KeyDestroyed
}

// KeyDestroyed is KeyCustody of a signer whose private key is destroyed.
const KeyDestroyed = "destroyed"

// Load reads the signers.
func (k *Keeper) Load(ctx context.Context) (Snapshot, error) {
	now, err := k.st.Now(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	rows, set, err := k.st.ListSigners(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	snap := Snapshot{set: set, Now: now, refs: map[string][]byte{}}
	for _, r := range rows {
		snap.Signers = append(snap.Signers, fromRow(r))
		snap.refs[r.VersionID] = r.KeyRef
	}
	return snap, nil
}

func fromRow(r store.Signer) Signer {
	return Signer{VersionID: r.VersionID, PublicKey: r.PublicKey, State: State(r.State), PublishedAt: r.PublishedAt,
		EffectiveAt: r.EffectiveAt, GraceUntil: r.GraceUntil, RetiresAt: r.RetiresAt, EndedAt: r.EndedAt, Previous: r.Previous}
}

func toRow(s Signer, ref []byte) store.Signer {
	return store.Signer{VersionID: s.VersionID, PublicKey: s.PublicKey, KeyRef: ref, State: string(s.State), PublishedAt: s.PublishedAt,
		EffectiveAt: s.EffectiveAt, GraceUntil: s.GraceUntil, RetiresAt: s.RetiresAt, EndedAt: s.EndedAt, Previous: s.Previous}
}

// Result is one applied step: the changes written, the set version they
// made, the store's time the step was planned at, and what became of
// the keys of the signers it ended.
type Result struct {
	Changes []Change
	Version int64
	At      time.Time
	// refs are the key references of the changed signers, as written.
	refs map[string][]byte
	Keys []KeyFate
}

// KeyCustody names where the private key of a changed signer lives, as
// Snapshot.KeyCustody does ("" for a version the step did not change), so
// the answer to a step says what muster signer list says.
func (r Result) KeyCustody(versionID string) string {
	ref, ok := r.refs[versionID]
	switch {
	case !ok:
		return ""
	case len(ref) == 0:
		return KeyDestroyed
	}
	return Where(ref)
}

// KeyFate is what became of an ended signer's private key: destroyed;
// left in a token this authority does not open (Left: its reference is
// dropped, the object is to delete by hand); or kept for the leader's next
// pass (Err says why).
type KeyFate struct {
	VersionID string
	// Where is where the key was: "sealed" or its token object's URI.
	Where string
	// Module is the PKCS#11 library of the token a Left key is in, ""
	// when none is known (the commands then name MODULE).
	Module string
	Left   bool
	Err    error
}

func (f KeyFate) String() string {
	switch {
	case f.Err != nil:
		return fmt.Sprintf("destroying %s's key (%s) failed, the leader retries it: %v", f.VersionID, f.Where, f.Err)
	case f.Left:
		// No token is open here: the module is the one the keeper was
		// told (WithLeftModule), else MODULE, explained.
		return fmt.Sprintf("%s's key (%s) is in a PKCS#11 token this authority does not open: its reference is dropped; if the token comes back, %s", f.VersionID, f.Where, custody.DeleteByHand(f.Module, []byte(f.Where)))
	}
	return fmt.Sprintf("%s's key (%s) destroyed", f.VersionID, f.Where)
}

// KeyDestroyer is the ability of a signer custody to destroy a key it
// made (InCustody has it). A sealed key needs none: it is its reference,
// which goes from the store.
type KeyDestroyer interface {
	Destroy(ctx context.Context, versionID string, k Key) error
}

// destroyKey destroys the key of a signer read from the store as ended
// with ref: the token object first, then the reference, in one
// conditional write with its node_task_signer.destroy_key record (by
// who), so a failure anywhere, the record's included, leaves the
// reference for the next pass (destroying an object already gone is no
// error). A token this authority does not open (no token configured: the
// operator left it, muster ca migrate-custody --rollback) will not answer
// later either: the reference is dropped and the object left, to delete
// by hand. won is false when another replica dropped the reference first.
func (k *Keeper) destroyKey(ctx context.Context, who Actor, s Signer, ref []byte) (f KeyFate, won bool) {
	f = KeyFate{VersionID: s.VersionID, Where: Where(ref)}
	if custody.IsPKCS11Ref(ref) {
		d, ok := k.custody.(KeyDestroyer)
		err := custody.ErrNoToken
		if ok {
			err = d.Destroy(ctx, custodyID(s.VersionID), Key{Public: s.PublicKey, Ref: ref})
		}
		switch {
		case errors.Is(err, custody.ErrNoToken):
			f.Left, f.Module = true, k.leftModule
		case err != nil:
			f.Err = err
			return f, false
		}
	}
	link, err := k.audit.Builder(audit.Event{Actor: who.Name, Action: "node_task_signer." + string(ActDestroyKey),
		Result: audit.ResultOK, Target: s.VersionID, Source: who.Source, CorrelationID: who.CorrelationID,
		Reason: fmt.Sprintf("%s signer %s (ended_at=%s): %s", s.State, s.VersionID, s.EndedAt.UTC().Format(time.RFC3339), f)})
	if err == nil {
		err = k.st.DropSignerKey(ctx, s.VersionID, ref, link.Build)
	}
	if errors.Is(err, store.ErrConflict) {
		return f, false
	}
	if f.Err = err; err != nil {
		return f, false
	}
	k.audit.Appended(link)
	return f, true
}

// RolloutIssuedAt is the issue time of the rotate task of a step taken at
// stepAt (Result.At) and sent at now. The step checked the staged signer's
// effective time against the lead time from stepAt, and agents check
// effective_at - issued_at against the same lead time, so a task sent
// right after its step is dated by the step: dated a moment later it would
// fall short and be refused when staged (or re-staged by a rollback) with
// exactly signer.min_lead_time. A task sent later is dated now; agents
// that miss it learn the signer from the verifier set.
func RolloutIssuedAt(stepAt, now time.Time) time.Time {
	if d := now.Sub(stepAt); d >= 0 && d < time.Minute {
		return stepAt
	}
	return now
}

// wholeSecond rounds t up to a whole second: a rotate task carries the
// effective time in RFC 3339 seconds, and one cut down to the second would
// fall short of the lead time the step checked.
func wholeSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}

// apply writes a plan read from snap, the step a (by who), with its
// record: the step and its node_task_signer.<a> record are one
// transaction. ref is the new signer's key reference for a plan that
// inserts one.
func (k *Keeper) apply(ctx context.Context, who Actor, a Action, snap Snapshot, changes []Change, ref []byte) (Result, error) {
	rows := make([]store.SignerChange, len(changes))
	refs := make(map[string][]byte, len(changes))
	var keys []string // what becomes of the ended signers' keys, for the record
	for i, c := range changes {
		r := snap.refs[c.To.VersionID]
		if c.From == none {
			r = ref
		}
		// A sealed key is its reference: it goes with the step that ends
		// the signer. A token's key goes after the write (below).
		drop := c.From != none && c.To.State.Ended() && len(r) > 0 && !custody.IsPKCS11Ref(r)
		rows[i] = store.SignerChange{From: string(c.From), To: toRow(c.To, r), DropKey: drop}
		switch {
		case drop:
			keys = append(keys, KeyFate{VersionID: c.To.VersionID, Where: Where(r)}.String())
			r = nil
		case c.From != none && c.To.State.Ended() && len(r) > 0:
			keys = append(keys, fmt.Sprintf("%s's key (%s) is destroyed after the step (node_task_signer.%s)", c.To.VersionID, Where(r), ActDestroyKey))
		}
		refs[c.To.VersionID] = r
	}
	// The set of the version the step leaves is kept before the step: a
	// set is kept only while its version is the store's, so one left
	// unkept now never would be, and agents still holding the set before
	// it would have to take the step's set from there, which they may
	// not (a signer staged in the gap signs an activation). The replica
	// that took the step before may not have kept it yet (its read went
	// stale), or it is the first signer's, left to the first server. A
	// conflict is the step's too (the version moved); any other failure
	// (the token does not answer) does not hold the step back: a
	// revocation must not wait on a set before it.
	if len(snap.Signers) > 0 {
		if _, err := k.keepSet(ctx, snap, nil); errors.Is(err, store.ErrConflict) {
			return Result{}, err
		}
	}
	link, err := k.audit.Builder(stepEvent(who, a, snap.Version()+1, changes, keys))
	if err != nil {
		return Result{}, err
	}
	// Conditional on the whole set ID read: the version alone repeats
	// after a restore, and a step planned from the signers before it must
	// not land on the restored ones (store.ErrConflict: read again).
	v, err := k.st.ApplySignerChanges(ctx, snap.set, rows, link.Build)
	if err != nil {
		return Result{}, err
	}
	k.audit.Appended(link)
	// Sign and keep the new set now, while the set it follows is known:
	// its signer is chosen against snap's states. A failure here is not
	// the step's: the next request signs it (against the kept set before).
	var prev map[string]State // none before the first signer
	for _, s := range snap.Signers {
		if prev == nil {
			prev = map[string]State{}
		}
		prev[s.VersionID] = s.State
	}
	// An error is not the step's: the set is signed on the next request.
	// The first signer's set (none before it) is left to the first
	// process that serves it, as no agent can hold a set yet: created by
	// muster init, which reads no authority.yaml, it carried the default
	// signer.min_lead_time to every agent whatever the authority ran with.
	if prev != nil {
		_, _ = k.publish(ctx, prev, v)
	}
	// The ended signers' keys go after the set is out, so a revocation
	// reaches agents without waiting on the token.
	var fates []KeyFate
	for i, c := range changes {
		r := snap.refs[c.To.VersionID]
		switch {
		case rows[i].DropKey:
			fates = append(fates, KeyFate{VersionID: c.To.VersionID, Where: Where(r)})
		case c.From != none && c.To.State.Ended() && len(r) > 0:
			// The write won: this replica destroys the token object now,
			// not with what is left of the caller's deadline; if the token
			// does not answer, the leader's next pass does (DestroyEnded).
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
			f, _ := k.destroyKey(dctx, who, c.To, r)
			cancel()
			if f.Err == nil {
				refs[c.To.VersionID] = nil
			} else {
				// Said once, here: the leader's passes retry it quietly,
				// and the one that destroys it records it.
				k.refused(ctx, who, ActDestroyKey, c.To.VersionID, errors.New(f.String()))
			}
			fates = append(fates, f)
		}
	}
	return Result{Changes: changes, Version: v, At: snap.Now, Keys: fates, refs: refs}, nil
}

// destroyTimeout bounds one destruction of a token key.
const destroyTimeout = 30 * time.Second

// stepEvent is the record of a step a (by who) about to be written,
// making verifier set version: the acting signer version as the target,
// and in the reason each change with its times and what becomes of the
// ended signers' keys.
func stepEvent(who Actor, a Action, version int64, changes []Change, keys []string) audit.Event {
	e := audit.Event{Actor: who.Name, Action: "node_task_signer." + string(a), Result: audit.ResultOK,
		Source: who.Source, CorrelationID: who.CorrelationID}
	var parts []string
	for _, c := range changes {
		if e.Target == "" && c.Action == a {
			e.Target = c.To.VersionID
		}
		parts = append(parts, describe(c))
	}
	parts = append(parts, keys...)
	e.Reason = fmt.Sprintf("verifier set version %d: %s", version, strings.Join(parts, "; "))
	return e
}

// refused audits a step that was not taken (a rule's refusal, a lost race,
// a failure of the store or the custody): asked, the version the
// operator named ("" for the steps that name none), is its target (muster
// signer revoke v9 is audited as a refused revoke of v9, not of nothing).
// A step taken is recorded with its write (apply).
func (k *Keeper) refused(ctx context.Context, who Actor, a Action, asked string, err error) {
	e := audit.Event{Actor: who.Name, Action: "node_task_signer." + string(a), Target: asked, Result: audit.ResultDenied,
		Source: who.Source, CorrelationID: who.CorrelationID, Reason: err.Error()}
	switch {
	case errors.Is(err, store.ErrConflict):
		// A lost race is refused as the operator is told (ABORTED), with
		// the way out, not as a failure of the authority: the store's
		// words (a set version, a step time) follow for the record.
		e.Reason = ChangedConcurrently + " (" + err.Error() + ")"
	case !IsRule(err):
		e.Result = audit.ResultError
	}
	// The refusal stands whether or not its record is written: the
	// authority's Auditor logs a record it could not write.
	_, _ = k.audit.Record(context.WithoutCancel(ctx), e)
}

// describe states one change for the audit: version, states, previous
// version and times.
func describe(c Change) string {
	from := string(c.From)
	if from == "" {
		from = "new"
	}
	s := fmt.Sprintf("%s %s->%s", c.To.VersionID, from, c.To.State)
	if c.To.Previous != "" {
		s += " previous=" + c.To.Previous
	}
	for _, t := range []struct {
		name string
		at   time.Time
	}{{"effective_at", c.To.EffectiveAt}, {"grace_until", c.To.GraceUntil}, {"retires_at", c.To.RetiresAt}, {"ended_at", c.To.EndedAt}} {
		if !t.at.IsZero() {
			s += " " + t.name + "=" + t.at.UTC().Format(time.RFC3339)
		}
	}
	return s
}

// IsRule reports whether err is a refusal by the lifecycle's rules (as
// opposed to a failure of the store or the custody): the operator can act
// on its message.
func IsRule(err error) bool {
	var ie *IllegalError
	var te *TimesError
	for _, e := range []error{ErrExists, ErrNoActive, ErrStagedExists, ErrNotFound, ErrNoStaged, ErrNoSuccessor, ErrNoRotation, ErrRollbackClosed, ErrNotDue, ErrMalformedVersionID, ErrChanged, ErrNotThatRotation} {
		if errors.Is(err, e) {
			return true
		}
	}
	return errors.As(err, &ie) || errors.As(err, &te)
}

// EnsureFirst creates the first signer, active, if there is none: at init,
// and at every authority start so that an upgraded authority gets one.
// Replicas starting together create one between them: the losers find it
// made and return created false. The first verifier set is not signed
// here but by the first keeper that serves it (VerifierSet) or steps from
// it (apply), with that keeper's signer.min_lead_time: the authority's,
// not init's default.
func (k *Keeper) EnsureFirst(ctx context.Context, who Actor) (created bool, err error) {
	snap, err := k.Load(ctx)
	if err != nil {
		return false, err
	}
	if len(snap.Signers) > 0 {
		return false, nil
	}
	id := NextVersionID(snap.Signers)
	key, err := k.custody.Generate(ctx, id)
	if err != nil {
		return false, err
	}
	changes, err := PlanCreate(snap.Signers, id, key.Public, snap.Now)
	if err != nil {
		return false, k.discardUnstored(ctx, id, key, err)
	}
	_, err = k.apply(ctx, who, ActCreate, snap, changes, key.Ref)
	if err != nil {
		err = k.discardUnstored(ctx, id, key, err)
	}
	if errors.Is(err, store.ErrConflict) {
		// Another replica created it first.
		return false, nil
	}
	if err != nil {
		k.refused(ctx, who, ActCreate, "", err)
		return false, err
	}
	return true, nil
}

// Stage publishes a new signer, effective effectiveIn from now (at least
// the lead time), keeping the active one accepted for grace after that.
func (k *Keeper) Stage(ctx context.Context, who Actor, effectiveIn, grace time.Duration) (Result, error) {
	res, err := k.stage(ctx, who, effectiveIn, grace)
	if err != nil {
		k.refused(ctx, who, ActStage, "", err)
	}
	return res, err
}

// GraceTooShort is the refusal of a grace under MinGrace; way names the
// command (or flag) that asks for a longer one.
func GraceTooShort(grace time.Duration, way string) string {
	return fmt.Sprintf("grace %s is under %s: the rotate task carries grace_until in whole seconds, where it would equal effective_at and agents would refuse the task; give a grace of at least %s (%s)",
		grace, MinGrace, MinGrace, way)
}

func (k *Keeper) stage(ctx context.Context, who Actor, effectiveIn, grace time.Duration) (Result, error) {
	snap, err := k.Load(ctx)
	if err != nil {
		return Result{}, err
	}
	if grace < MinGrace {
		return Result{}, &TimesError{Reason: GraceTooShort(grace, "`muster signer stage --grace 24h`")}
	}
	base := NextVersionID(snap.Signers)
	eff := wholeSecond(snap.Now.Add(effectiveIn))
	// Check the rules before custody makes a key that would be thrown away.
	if _, err := PlanStage(snap.Signers, base, make([]byte, 32), snap.Now, eff, eff.Add(grace), k.MinLeadTime()); err != nil {
		return Result{}, err
	}
	key, err := k.custody.Generate(ctx, base)
	if err != nil {
		return Result{}, err
	}
	id := KeyVersionID(base, key.Public)
	changes, err := PlanStage(snap.Signers, id, key.Public, snap.Now, eff, eff.Add(grace), k.MinLeadTime())
	if err != nil {
		return Result{}, k.discardUnstored(ctx, id, key, err)
	}
	res, err := k.apply(ctx, who, ActStage, snap, changes, key.Ref)
	if err != nil {
		return Result{}, k.discardUnstored(ctx, id, key, err)
	}
	return res, nil
}

// discardUnstored destroys key, made in a token for the signer id of a
// step whose write failed with err, so that a failed step leaves nothing
// in the token: no row would ever name the object, and no sweep find it.
// A failure whose commit may have landed (the store's answer was lost)
// is read back first, and a key the store holds is kept. A key that
// cannot be destroyed, or whose fate cannot be read back, is named in
// the returned error with the commands that delete it. A sealed key is
// its reference: nothing is left of it outside the store.
func (k *Keeper) discardUnstored(ctx context.Context, id string, key Key, err error) error {
	if !custody.IsPKCS11Ref(key.Ref) {
		return err
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
	defer cancel()
	if !errors.Is(err, store.ErrConflict) {
		snap, lerr := k.Load(dctx)
		if lerr != nil {
			return fmt.Errorf("%w; its new key (%s) may be left in the token: if `muster signer list` does not show %s, %s",
				err, Where(key.Ref), id, custody.DeleteByHand(custody.ModuleOf(k.custody), key.Ref))
		}
		for _, ref := range snap.refs {
			if bytes.Equal(ref, key.Ref) {
				return err // stored: the key is the signer's
			}
		}
	}
	d, ok := k.custody.(KeyDestroyer)
	if !ok {
		return err
	}
	if derr := d.Destroy(dctx, custodyID(id), key); derr != nil {
		return fmt.Errorf("%w; destroying its new key (%s) failed (%v): %s",
			err, Where(key.Ref), derr, custody.DeleteByHand(custody.ModuleOf(k.custody), key.Ref))
	}
	return err
}

// step reads the signers, plans with plan and writes the result.
// asked is the version the operator named ("" for the steps that name
// none), the target of the step's audit record if it is refused.
func (k *Keeper) step(ctx context.Context, who Actor, a Action, asked string, plan func(Snapshot) ([]Change, error)) (Result, error) {
	res, err := func() (Result, error) {
		snap, err := k.Load(ctx)
		if err != nil {
			return Result{}, err
		}
		changes, err := plan(snap)
		if err != nil {
			return Result{}, err
		}
		return k.apply(ctx, who, a, snap, changes, nil)
	}()
	if err != nil {
		k.refused(ctx, who, a, asked, err)
	}
	return res, err
}

// Activate makes the staged signer active now, whichever it is.
func (k *Keeper) Activate(ctx context.Context, who Actor) (Result, error) {
	return k.ActivateSeen(ctx, who, Seen{})
}

// ActivateSeen makes the staged signer active now if it is the one the
// operator saw (seenStep): not a signer staged since by another operator
// after the one they saw was activated by the clock or rolled back.
func (k *Keeper) ActivateSeen(ctx context.Context, who Actor, seen Seen) (Result, error) {
	return k.seenStep(ctx, who, ActActivate, seen, func(s Snapshot) ([]Change, Change, error) {
		changes, err := PlanActivate(s.Signers, ByCommand, s.Now)
		if err != nil {
			return nil, Change{}, err
		}
		// The last change is the staged signer made active.
		return changes, changes[len(changes)-1], nil
	})
}

// Retire retires the signer in grace now, whichever it is.
func (k *Keeper) Retire(ctx context.Context, who Actor) (Result, error) {
	return k.RetireSeen(ctx, who, Seen{})
}

// RetireSeen retires the signer in grace now if it is the one the operator
// saw (seenStep): not the one a later activation put in grace, whose
// agents may not all hold its successor yet.
func (k *Keeper) RetireSeen(ctx context.Context, who Actor, seen Seen) (Result, error) {
	return k.seenStep(ctx, who, ActRetire, seen, func(s Snapshot) ([]Change, Change, error) {
		changes, err := PlanRetire(s.Signers, ByCommand, s.Now)
		if err != nil {
			return nil, Change{}, err
		}
		return changes, changes[0], nil
	})
}

// Revoke revokes one signer now, on whatever set is current.
func (k *Keeper) Revoke(ctx context.Context, who Actor, versionID string) (Result, error) {
	return k.RevokeSeen(ctx, who, Seen{VersionID: versionID})
}

// RevokeSeen revokes the signer seen.VersionID now if the set is still the
// one the operator saw (seenStep): revoking the active signer also
// activates the staged one, which must not be one staged since (after the
// one they saw was activated or rolled back), unseen and perhaps not yet
// held by every agent.
func (k *Keeper) RevokeSeen(ctx context.Context, who Actor, seen Seen) (Result, error) {
	return k.seenStep(ctx, who, ActRevoke, seen, func(s Snapshot) ([]Change, Change, error) {
		changes, err := PlanRevoke(s.Signers, seen.VersionID, s.Now)
		if err != nil {
			return nil, Change{}, err
		}
		// The first change is the revoked signer, the one named.
		return changes, changes[0], nil
	})
}

// Rollback undoes the rotation in progress (PlanRollback), whichever it is.
func (k *Keeper) Rollback(ctx context.Context, who Actor) (Result, error) {
	return k.RollbackSeen(ctx, who, Seen{})
}

// Seen is what the operator saw when asking for a step: the signer it
// moves and the verifier set version of the list they read. The zero
// value asks for no check (an older client).
type Seen struct {
	VersionID  string
	SetVersion int64
}

// ErrChanged is returned for a step asked on a verifier set version that
// has moved since: its meaning may have changed (a second rollback would
// discard the signer the first put back to staged), so it is not taken.
var ErrChanged = errors.New("signer: the signers changed since they were read")

// ErrNotThatRotation is returned for a step (activate, retire, rollback)
// naming a signer other than the one it would move.
var ErrNotThatRotation = errors.New("signer: the rotation in progress is not the one named")

// RollbackSeen undoes the rotation in progress if it is the one the
// operator saw (seenStep).
func (k *Keeper) RollbackSeen(ctx context.Context, who Actor, seen Seen) (Result, error) {
	return k.seenStep(ctx, who, ActRollback, seen, func(s Snapshot) ([]Change, Change, error) {
		changes, err := PlanRollback(s.Signers, s.Now, k.MinLeadTime())
		if err != nil {
			return nil, Change{}, err
		}
		// The first change is the signer the rollback moves: the staged
		// one it discards, or the active one it puts back to staged.
		return changes, changes[0], nil
	})
}

// seenStep takes an operator's step (activate, retire, rollback, revoke) if it is
// the one they saw: the set version still seen.SetVersion and the signer
// it moves seen.VersionID (each checked when set). The check reads the
// same snapshot the write is conditional on (apply writes only if the set
// version has not moved), so check and change are one conditional write,
// on every replica and store.
func (k *Keeper) seenStep(ctx context.Context, who Actor, a Action, seen Seen, plan func(Snapshot) ([]Change, Change, error)) (Result, error) {
	again := map[Action]string{
		ActActivate: "run `muster signer list`, then `muster signer activate` again if it is still wanted",
		ActRetire:   "run `muster signer list`, then `muster signer retire` again if it is still wanted",
		ActRollback: "run `muster signer list`, then `muster signer rollback` again if it is still wanted",
		ActRevoke:   fmt.Sprintf("run `muster signer list`, then `muster signer revoke %s` again if it is still wanted", seen.VersionID),
	}[a]
	return k.step(ctx, who, a, seen.VersionID, func(s Snapshot) ([]Change, error) {
		if seen.SetVersion != 0 && s.Version() != seen.SetVersion {
			return nil, fmt.Errorf("%w: the %s was asked on verifier set version %d and it is %d now (another operator, replica or the clock took a step meanwhile), so nothing changed: %s",
				ErrChanged, a, seen.SetVersion, s.Version(), again)
		}
		changes, moved, err := plan(s)
		if err != nil {
			return nil, err
		}
		if seen.VersionID != "" && moved.To.VersionID != seen.VersionID {
			return nil, fmt.Errorf("%w: a %s now would move %s (%s), not %s, so nothing changed: %s",
				ErrNotThatRotation, a, moved.To.VersionID, moved.From, seen.VersionID, again)
		}
		return changes, nil
	})
}

// ActAdvance is the audit action of a verifier set version moved past
// what agents hold after a store restore (Advance).
const ActAdvance Action = "advance"

// MaxAdvance bounds how far Advance moves the version at once: a restore
// loses the steps since its backup, a handful; an agent reporting a
// version far beyond (a bug, or a compromised agent trying to exhaust the
// version) is not followed.
const MaxAdvance = 10000

// refusal is a set Advance does not follow, as ahead reports it.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }

// VerifyAhead reports whether Advance would follow raw: behind when raw is
// above the store's version and passes every check Advance makes before
// it writes; refused, the reason Advance would refuse it; err, the
// store's error. It writes and audits nothing, so the authority can spend
// its once-a-minute advance on a set that verified, not on a made-up one.
func (k *Keeper) VerifyAhead(ctx context.Context, raw []byte) (behind bool, refused, err error) {
	_, _, behind, err = k.ahead(ctx, raw)
	var r refusal
	if errors.As(err, &r) {
		return false, r.err, nil
	}
	return behind, nil, err
}

// ahead checks raw as Advance follows it: the parsed set and the store's
// snapshot, and whether the store is behind it; or a refusal.
func (k *Keeper) ahead(ctx context.Context, raw []byte) (parsedSet, Snapshot, bool, error) {
	p, err := parseSigned(raw)
	if err != nil {
		return parsedSet{}, Snapshot{}, false, refusal{fmt.Errorf("signer: the agent's verifier set: %w", err)}
	}
	set := p.set
	if set.AuthorityID != k.authorityID {
		return parsedSet{}, Snapshot{}, false, refusal{fmt.Errorf("signer: the agent's verifier set is for authority %q, not %q", set.AuthorityID, k.authorityID)}
	}
	snap, err := k.Load(ctx)
	if err != nil || set.Version <= snap.Version() {
		return parsedSet{}, snap, false, err
	}
	if set.Version-snap.Version() > MaxAdvance {
		return parsedSet{}, snap, false, refusal{fmt.Errorf("signer: an agent's verifier set has version %d, %d above the store's %d: more than a restore loses (%d); not followed", set.Version, set.Version-snap.Version(), snap.Version(), MaxAdvance)}
	}
	var held *Signer
	for i := range snap.Signers {
		if snap.Signers[i].VersionID == p.signer {
			held = &snap.Signers[i]
		}
	}
	if k, ok := set.Key(p.signer); !ok || !k.State.SignsSets() || held == nil || !p.verify(EncodePublicKey(held.PublicKey)) {
		return parsedSet{}, snap, false, refusal{fmt.Errorf("signer: an agent's verifier set version %d is not signed by a key this store holds under %q (made up, or a key lost with a restored backup: see \"Restoring the store\" in docs/signer-lifecycle.md); not followed: %s", set.Version, p.signer, JoinAgainHint)}
	}
	return p, snap, true, nil
}

// ErrNoCommonSigner refuses an advance when no key is active or staged
// both in the set an agent holds and in the store: agents holding that set
// would refuse any set the store can sign (the backup predates an
// activation they saw). Nothing is published; see the restore procedure.
var ErrNoCommonSigner = errors.New("signer: no key is active or staged both in the verifier set agents hold and in the store (the backup predates an activation they saw); nothing published: follow \"Restoring the store\" in docs/signer-lifecycle.md; " + JoinAgainHint)

// JoinAgainHint is the way out for agents holding a verifier set the
// store's sets cannot follow: nothing the authority signs reaches them.
const JoinAgainHint = "agents holding it (`muster agents show NODE` names the signers one accepts) must join again: muster agent join --force --data ADIR --node NODE with a joining URI from muster token create --node NODE"

// Advance moves the verifier set version past the set an agent holds
// (raw, as its heartbeat carries it) when that set is above the store's
// version (the store was restored from a backup: the version went back),
// and publishes the set at the new version, signed by a key active or
// staged both in the agent's set and in the store, so the agents holding
// it take the new one. The agent's set is followed only if it parses, is
// for this authority, is signed by a key the store holds under the
// version ID it names (verified with the store's public key, so no agent
// can make one up), and is at most MaxAdvance above the store. It
// returns a zero Result when the store is not behind the set, or when
// another replica advanced it first; ErrNoCommonSigner, with nothing
// written, when no key qualifies to sign. The new set is signed first,
// by a key the agents hold, and kept in the advance's own write: no
// replica ever sees the advanced version without it. With an error,
// nothing was written and the Result is zero. Every advance and refusal
// is audited as node_task_signer.advance (the authority calls this, for a
// set VerifyAhead passed, at most once a minute per replica, and for one
// it refused at most once a minute too, which bounds the records).
func (k *Keeper) Advance(ctx context.Context, who Actor, raw []byte) (Result, error) {
	p, snap, behind, err := k.ahead(ctx, raw)
	var r refusal
	if errors.As(err, &r) {
		_, _ = k.audit.Record(context.WithoutCancel(ctx), audit.Event{Actor: who.Name, Action: "node_task_signer." + string(ActAdvance),
			Result: audit.ResultDenied, Source: who.Source, CorrelationID: who.CorrelationID, Reason: r.err.Error()})
		return Result{}, r.err
	}
	if err != nil || !behind {
		return Result{}, err
	}
	set := p.set
	prev := map[string]State{}
	for _, key := range set.Keys {
		prev[key.VersionID] = key.State
	}
	res := Result{Version: set.Version + 1}
	e := audit.Event{Actor: who.Name, Action: "node_task_signer." + string(ActAdvance), Result: audit.ResultOK,
		Source: who.Source, CorrelationID: who.CorrelationID,
		Reason: fmt.Sprintf("verifier set version %d: an agent holds version %d, above the store's %d (restored from a backup?)", set.Version+1, set.Version, snap.Version())}
	// The set is signed before the write and kept with it: a replica that
	// saw the version moved with no set kept would sign one against no
	// set before, with the store's active key, which agents may hold
	// only in grace (they would refuse it and every set after).
	var signed []byte
	if by, serr := Signing(prev, snap.Signers); serr != nil {
		err = ErrNoCommonSigner
	} else if signed, err = NewVerifierSet(k.authorityID, res.Version, snap.Signers, snap.Now, k.MinLeadTime()).Sign(by.VersionID, func(msg []byte) ([]byte, error) {
		return k.signWith(ctx, snap, by, msg)
	}); err == nil {
		// The advance is written with its set and its record, or not at
		// all.
		var link *audit.Link
		if link, err = k.audit.Builder(e); err == nil {
			err = k.st.AdvanceSignerSet(ctx, snap.set, res.Version, signed, link.Build)
		}
		if errors.Is(err, store.ErrConflict) {
			return Result{}, nil
		}
		if err == nil {
			k.audit.Appended(link)
			return res, nil
		}
	}
	e.Result, e.Reason = audit.ResultError, fmt.Sprintf("agent set version %d, store %d: %v", set.Version, snap.Version(), err)
	if errors.Is(err, ErrNoCommonSigner) {
		e.Result = audit.ResultDenied
	}
	_, _ = k.audit.Record(context.WithoutCancel(ctx), e)
	// Nothing was written: a Result with a version is an advance made.
	return Result{}, err
}

// SetVersion is the store's verifier set version.
func (k *Keeper) SetVersion(ctx context.Context) (int64, error) {
	id, err := k.st.SignerSetID(ctx)
	return id.Version, err
}

// Tick takes the step the clock has made due, if any: the leader's job.
// It returns a zero Result when nothing was due, or when another replica
// took the step first.
func (k *Keeper) Tick(ctx context.Context, who Actor) (Result, error) {
	snap, err := k.Load(ctx)
	if err != nil {
		return Result{}, err
	}
	changes, err := Due(snap.Signers, snap.Now)
	if err != nil || len(changes) == 0 {
		return Result{}, err
	}
	a := changes[len(changes)-1].Action
	res, err := k.apply(ctx, who, a, snap, changes, nil)
	if errors.Is(err, store.ErrConflict) {
		return Result{}, nil
	}
	if err != nil {
		k.refused(ctx, who, a, "", err)
	}
	return res, err
}

// ActDestroyKey is the audit action of an ended signer's key destroyed by
// the leader's pass (DestroyEnded), not by the step that ended it.
const ActDestroyKey Action = "destroy_key"

// DestroyEnded destroys the private keys of retired and revoked signers
// that still have one: a token object the step that ended the signer could
// not destroy (the token did not answer), and the keys of signers ended
// before muster destroyed keys. The leader's job, at every clock pass;
// replicas racing on one key destroy it once between them (the token
// object's destruction is idempotent, the reference's a conditional
// write), and only the replica whose write won audits it as
// node_task_signer.destroy_key, in that write. Active, staged and grace signers' keys are
// never touched. It returns the keys destroyed and the errors of those it
// could not destroy, which stay for the next pass.
func (k *Keeper) DestroyEnded(ctx context.Context, who Actor) ([]KeyFate, error) {
	return k.DestroyEndedSpaced(ctx, who, nil)
}

// DestroyEndedSpaced is DestroyEnded for a clock that passes every few
// seconds: a key whose destruction failed is tried again only once waits
// says it is due, by the store clock (waits doubles the wait after each
// failure, up to its cap), so a token away for a day costs a few hundred
// round trips to it, not one per pass. A nil waits tries every key.
func (k *Keeper) DestroyEndedSpaced(ctx context.Context, who Actor, waits *retrywait.Waits) ([]KeyFate, error) {
	snap, err := k.Load(ctx)
	if err != nil {
		return nil, err
	}
	var (
		done    []KeyFate
		errs    []error
		pending = map[string]bool{}
	)
	for _, s := range snap.Signers {
		ref := snap.refs[s.VersionID]
		if !s.State.Ended() || len(ref) == 0 {
			continue
		}
		pending[s.VersionID] = true
		if waits != nil && !waits.Due(s.VersionID, snap.Now) {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, destroyTimeout)
		f, won := k.destroyKey(dctx, who, s, ref)
		cancel()
		if waits != nil {
			waits.Tried(s.VersionID, snap.Now, f.Err)
		}
		if f.Err != nil {
			errs = append(errs, fmt.Errorf("signer %s: destroying its key (%s): %w", s.VersionID, f.Where, f.Err))
			continue
		}
		if !won {
			continue
		}
		done = append(done, f)
	}
	if waits != nil {
		waits.Keep(pending)
	}
	return done, errors.Join(errs...)
}

// signWith signs msg with one signer version through custody.
func (k *Keeper) signWith(ctx context.Context, snap Snapshot, s Signer, msg []byte) ([]byte, error) {
	return k.custody.Sign(ctx, custodyID(s.VersionID), s.PublicKey, snap.refs[s.VersionID], msg)
}

// ActiveSigner returns the active signer's version ID and a function that
// signs with it.
func (k *Keeper) ActiveSigner(ctx context.Context) (string, func([]byte) ([]byte, error), error) {
	snap, err := k.Load(ctx)
	if err != nil {
		return "", nil, err
	}
	active, ok := ActiveOf(snap.Signers)
	if !ok {
		return "", nil, ErrNoActive
	}
	return active.VersionID, func(msg []byte) ([]byte, error) { return k.signWith(ctx, snap, active, msg) }, nil
}

// VerifierSet returns the current verifier set, signed by the active
// signer.
func (k *Keeper) VerifierSet(ctx context.Context) ([]byte, error) {
	raw, _, err := k.SignedVerifierSet(ctx, -1)
	return raw, err
}

// SignedVerifierSet returns the current verifier set and its version;
// nil when the version is still have, so a stream signs only the sets it
// sends.
//
// Each version is signed once, by any replica, and kept in the store
// (PutVerifierSet, only while the set ID it was signed at is the store's:
// publish): later requests, and agents catching up through the chain
// (Chain), get those very bytes. The signer is chosen against the
// set before (Signing), so every agent holding that one takes this one.
// The signed set is also kept here by set ID: an ID names one state of the
// signer rows (every step advances the version and stamps the store clock
// in the same conditional write). The version alone would not do: a store
// restored from a backup under a running authority and stepped back up to
// the version this one kept holds other signers, and only the step's time
// tells them apart. Each call still reads the ID from the store (one
// single-row read of committed state that every replica shares), so a step
// made through any replica is served by this one from the next call on —
// never an older set. (A renewal takes the ID along with its record in its
// one read, VerifierSetAt: read during the call all the same.)
func (k *Keeper) SignedVerifierSet(ctx context.Context, have int64) ([]byte, int64, error) {
	id, err := k.st.SignerSetID(ctx)
	if err != nil {
		return nil, 0, err
	}
	return k.signedAt(ctx, id, have)
}

// VerifierSetAt is VerifierSet for the set ID id, which the caller read
// from the store during its request (a renewal reads it with its record,
// store.RenewalRead): the same bytes, without a read of its own.
func (k *Keeper) VerifierSetAt(ctx context.Context, id store.SignerSetID) ([]byte, error) {
	raw, _, err := k.signedAt(ctx, id, -1)
	return raw, err
}

// signedAt is SignedVerifierSet once the store's set ID is read.
func (k *Keeper) signedAt(ctx context.Context, id store.SignerSetID, have int64) ([]byte, int64, error) {
	if id.Version == have {
		return nil, have, nil
	}
	if c := k.signed.Load(); c != nil {
		if c.id == id {
			return c.raw, id.Version, nil
		}
		if c.id.Version >= id.Version {
			// The store went back (restored from a backup), perhaps and
			// stepped up again: what was kept is not this store's.
			k.signed.CompareAndSwap(c, nil)
		}
	}
	c, err := k.publish(ctx, nil, -1)
	if err != nil {
		return nil, 0, err
	}
	if c.id.Version == have {
		return nil, have, nil
	}
	return c.raw, c.id.Version, nil
}

// SetMinLeadTime is the signer.min_lead_time the store's current verifier
// set carries, which agents apply to the next rotate task, and the set's
// version. The set carries the lead time in force when it was signed,
// the store's shared one (muster settings set), which may have changed
// since: this keeper's own may already be the newer value.
func (k *Keeper) SetMinLeadTime(ctx context.Context) (time.Duration, int64, error) {
	raw, v, err := k.SignedVerifierSet(ctx, -1)
	if err != nil {
		return 0, 0, err
	}
	set, err := ParseVerifierSet(raw)
	if err != nil {
		return 0, 0, err
	}
	return set.MinLeadTime(), v, nil
}

// kept returns the set the store keeps for version, nil if none.
func (k *Keeper) kept(ctx context.Context, version int64) ([]byte, error) {
	sets, err := k.st.VerifierSets(ctx, version-1, 1)
	if err != nil {
		return nil, err
	}
	if len(sets) == 1 && sets[0].Version == version {
		return sets[0].Raw, nil
	}
	return nil, nil
}

// publish returns the signed set of the store's current version: the one
// kept in the store, else one signed now and kept (the first kept wins a
// race between replicas at one set ID). prev is the states of the set
// before version made, when the caller knows them (a step that just made
// it); for any other version, and when prev is nil, they are read from
// the kept set before.
//
// The keep is conditional on the set ID read with the signers: a set
// signed from rows no longer current (another replica stepped, or the
// store was restored under this one, between the read and the write) is
// refused (store.ErrConflict) and neither kept nor served; the signers
// are read again and the current version's set is published instead.
func (k *Keeper) publish(ctx context.Context, prev map[string]State, made int64) (cachedSet, error) {
	var err error
	for range publishTries {
		var c cachedSet
		if c, err = k.publishOnce(ctx, prev, made); !errors.Is(err, store.ErrConflict) {
			return c, err
		}
	}
	return cachedSet{}, fmt.Errorf("signer: the verifier set moved under each of %d tries to publish it (steps in quick succession, or a store being restored); the next request tries again: %w", publishTries, err)
}

// publishTries bounds publish's reads: each retry follows a step or a
// restore that landed between one read and its write, which are rare.
const publishTries = 4

func (k *Keeper) publishOnce(ctx context.Context, prev map[string]State, made int64) (cachedSet, error) {
	snap, err := k.Load(ctx)
	if err != nil {
		return cachedSet{}, err
	}
	if snap.Version() != made {
		prev = nil
	}
	raw, err := k.keepSet(ctx, snap, prev)
	if err != nil {
		return cachedSet{}, err
	}
	c := cachedSet{id: snap.set, raw: raw}
	k.keep(c)
	return c, nil
}

// keepSet returns the set kept for snap's version, signing it from snap
// and keeping it first if none is (PutVerifierSet: store.ErrConflict if
// snap is no longer the store's). prev is the states of the set before,
// if known; else they are read from the kept set before.
func (k *Keeper) keepSet(ctx context.Context, snap Snapshot, prev map[string]State) ([]byte, error) {
	v := snap.Version()
	raw, err := k.kept(ctx, v)
	if err != nil || raw != nil {
		return raw, err
	}
	if prev == nil {
		if before, err := k.kept(ctx, v-1); err == nil && before != nil {
			if set, err := ParseVerifierSet(before); err == nil {
				prev = map[string]State{}
				for _, key := range set.Keys {
					prev[key.VersionID] = key.State
				}
			}
		}
	}
	by, err := Signing(prev, snap.Signers)
	if err != nil {
		return nil, err
	}
	signed, err := NewVerifierSet(k.authorityID, v, snap.Signers, snap.Now, k.MinLeadTime()).Sign(by.VersionID, func(msg []byte) ([]byte, error) {
		return k.signWith(ctx, snap, by, msg)
	})
	if err != nil {
		return nil, err
	}
	if err := k.st.PutVerifierSet(ctx, snap.set, signed); err != nil {
		return nil, err
	}
	// Another replica may have kept its own signing of v first:
	// every agent must see one set per version.
	if raw, err = k.kept(ctx, v); err != nil {
		return nil, err
	}
	if raw == nil {
		raw = signed
	}
	return raw, nil
}

// MaxChain bounds the sets one Chain answer carries; an agent further
// behind asks again from the last one it took.
const MaxChain = 64

// Chain returns the kept sets after have, oldest first, ending with the
// current one: an agent that holds have takes them in turn (Trust.AcceptChain),
// each signed by a key the one before holds as active or staged. At most
// MaxChain sets; the current one is always the last when the chain is
// not cut.
func (k *Keeper) Chain(ctx context.Context, have int64) ([][]byte, error) {
	if _, _, err := k.SignedVerifierSet(ctx, -1); err != nil {
		return nil, err
	}
	sets, err := k.st.VerifierSets(ctx, max(have, 0), MaxChain)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(sets))
	for i, s := range sets {
		out[i] = s.Raw
	}
	return out, nil
}

// keep caches s unless a newer version, or s itself, is cached already
// (two requests racing across a step must not put the older set back).
func (k *Keeper) keep(s cachedSet) {
	for {
		c := k.signed.Load()
		if c != nil && (c.id.Version > s.id.Version || c.id == s.id) {
			return
		}
		if k.signed.CompareAndSwap(c, &s) {
			return
		}
	}
}
