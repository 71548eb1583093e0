package authority

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
)

// caTick is how often the leader looks for an intermediate to prepare,
// activate or retire.
const caTick = 5 * time.Second

// caStepTimeout bounds one tick's steps: a store call that hangs (a
// half-open connection to PostgreSQL, a row lock held by a stuck
// transaction) or a token that stops answering must not stop the leader's
// rotations for good; the next tick tries again. Far above what a tick
// needs (a few store calls, at most a key made and a certificate signed
// per role).
const caStepTimeout = time.Minute

// retireMargin is how long after an intermediate stopped being active a
// replica may still sign with it: until it reads the store again (within
// caRefresh of the change, sooner on the change notification).
const retireMargin = time.Minute

// leafLifetime is the longest lifetime of a leaf each role's intermediate
// signs: agent certificates (--agent-cert-ttl's cap), the authority's own
// listener certificates, operator identities.
var leafLifetime = map[string]time.Duration{
	string(ca.RoleAgent):     maxLeafTTL,
	string(ca.RoleServer):    serverCertTTL,
	string(ca.RoleBootstrap): serverCertTTL,
	string(ca.RoleAdmin):     maxOperatorTTL,
}

// lastLeafExpiry is when the last leaf a retiring intermediate signed has
// expired (DESIGN.md "CA lifecycle": it is retired then, and leaves the
// trust bundle): it signed until it became retiring, no leaf outlives its
// role's longest lifetime, and none outlives the intermediate (ca.Issuer
// cuts it). So an intermediate replaced long before its own expiry (the
// year muster init gives, under a shorter ca.intermediate_ttl) does not
// stay in every bundle until then.
func lastLeafExpiry(r store.CACert) time.Time {
	longest, ok := leafLifetime[r.Role]
	if !ok || r.RetiringAt.IsZero() {
		return r.NotAfter
	}
	if t := r.RetiringAt.Add(longest + retireMargin); t.Before(r.NotAfter) {
		return t
	}
	return r.NotAfter
}

// caPublishWindow is how long a prepared intermediate is in the store
// before it may be activated, by the leader's clock or by an operator:
// every replica reads a CA step within about a second of its notification
// (and again whenever its watch listens anew), opens its key and signs its
// empty revocation list; one whose read fails reports not ready
// (/readyz), so it takes no traffic. Past the window, every ready replica
// publishes the successor in its trust bundle and accepts its leaves, so
// a leaf signed by it is never presented to a replica that refuses it.
// Config.CAPublishWindow overrides it, for tests.
const caPublishWindow = 10 * time.Second

func (s *Server) caPublishWindow() time.Duration {
	if s.cfg.CAPublishWindow > 0 {
		return s.cfg.CAPublishWindow
	}
	return caPublishWindow
}

// caWarnAhead is how long before a successor is due (half the active
// intermediate's life) the authority warns that it cannot prepare one
// for want of the root key; caWarnEvery is how often the leader logs it.
const (
	caWarnAhead = 60 * 24 * time.Hour
	caWarnEvery = 24 * time.Hour
)

// MinCAIntermediateTTL is ca.intermediate_ttl's floor: short enough for
// tests to watch rotations, long enough that a step every caTick keeps up.
const MinCAIntermediateTTL = 2 * time.Minute

// caClock is the leader's job that rotates the intermediates (DESIGN.md
// "CA lifecycle"): at half the active one's life it prepares a successor,
// at two thirds it activates it, and it retires a retiring one once the
// last leaf it signed has expired — at its own not-after, since no leaf
// outlives its issuer (ca.Issuer.Issue cuts it). Each step is one
// conditional write, so a step another replica took first conflicts and
// is skipped. A step that waits for a prepared intermediate's publish
// window wakes the clock when the window ends, not at the tick after it:
// a root rotation's update_servers answers once the window has passed.
func (s *Server) caClock(ctx context.Context) error {
	tick := cmp.Or(s.cfg.CATick, caTick)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, cmp.Or(s.caStepTimeout, caStepTimeout))
		wake, err := s.caStepWake(sctx)
		cancel()
		if err != nil && ctx.Err() == nil && !s.outage.fail(err) {
			s.log.Error("CA rotation step failed", "err", err)
		}
		var atWindowEnd <-chan time.Time
		stop := func() bool { return false }
		if wake > 0 && wake < tick {
			w := time.NewTimer(wake)
			atWindowEnd, stop = w.C, w.Stop
		}
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-t.C:
		case <-s.caPoke:
		case <-atWindowEnd:
		}
		stop()
	}
}

// caIntermediateTTL is ca.intermediate_ttl, a shared setting.
func (s *Server) caIntermediateTTL() time.Duration { return s.shared().CAIntermediateTTL }

// caStep takes every rotation step that has come due by the store clock.
func (s *Server) caStep(ctx context.Context) error {
	_, err := s.caStepWake(ctx)
	return err
}

// caStepWake is caStep that also returns how long after the store clock's
// now the publish window of a prepared intermediate ends (0 if none is
// waiting), so that the clock takes the step it waits for then.
func (s *Server) caStepWake(ctx context.Context) (time.Duration, error) {
	now, err := s.store.Now(ctx)
	if err != nil {
		return 0, err
	}
	wake, err := s.caStepUntil(ctx, now)
	if err != nil || wake.IsZero() {
		return 0, err
	}
	return wake.Sub(now), nil
}

// caStepAt takes every rotation step due at now.
func (s *Server) caStepAt(ctx context.Context, now time.Time) error {
	_, err := s.caStepUntil(ctx, now)
	return err
}

// caStepUntil is caStepAt that also returns the earliest end of a publish
// window after now (zero if none): of an intermediate prepared before the
// step, or one this step prepared for a root rotation, whose window ends
// at the latest caPublishWindow from now (a step at its end that finds it
// a moment short returns that moment).
func (s *Server) caStepUntil(ctx context.Context, now time.Time) (wake time.Time, err error) {
	if s.inter.readFailing() {
		// This replica could not read the store's intermediates (one
		// whose key it cannot open: a replica still running without
		// the token muster ca migrate-custody recorded), so it would
		// activate a successor it cannot sign with and prepare the next
		// in its own custody, undoing the migration. It takes no step
		// until a read succeeds; it reports not ready meanwhile.
		return time.Time{}, nil
	}
	rows, err := s.store.ListCACerts(ctx)
	if err != nil {
		return time.Time{}, err
	}
	for _, r := range rows {
		if end := r.CreatedAt.Add(s.caPublishWindow()); r.State == store.CAPrepared && end.After(now) && (wake.IsZero() || end.Before(wake)) {
			wake = end
		}
	}
	// A steady tick finds the rows it found before: their certificates
	// come from the cache, and those no longer asked for are forgotten.
	defer s.caCerts.sweep()
	active, prepared := map[string]*x509.Certificate{}, map[string]store.CACert{}
	pending := map[string]bool{} // the retired intermediates whose key is due to be destroyed
	for _, r := range rows {
		switch r.State {
		case store.CAActive:
			c, err := s.caCerts.parse(r.Serial, r.CertDER)
			if err != nil {
				return time.Time{}, err
			}
			active[r.Role] = c
		case store.CAPrepared:
			prepared[r.Role] = r
		case store.CARetiring:
			if !now.Before(lastLeafExpiry(r)) {
				s.endIntermediate(ctx, "ca.retire", r.Role, r.Serial, "the last leaf it signed has expired", s.store.RetireCACert)
			}
		case store.CARetired:
			// Its key's destruction failed, or the replica that ended
			// it stopped before: taken again, once the step's own
			// destruction has had its deadline (it may be under way on
			// the replica whose write won, the leader before this one).
			// That deadline starts when the write returns, which may be
			// up to the write's own deadline after RetiredAt (the
			// store's time at the write's start): taken sooner, both
			// destroy, and the second's ca.destroy_key may say the key
			// was not found, lost, when the first destroyed it.
			// A destruction that keeps failing (the token away for
			// hours) is tried again less and less often, up to
			// caDestroyMaxWait apart: each try is a round trip to the
			// HSM, and a log line while the failure lasts.
			if r.KeyRef != nil && now.Sub(r.RetiredAt) >= 2*caStepTimeout {
				pending[r.Serial] = true
				if s.caDestroyRetry.Due(r.Serial, now) {
					s.caDestroyRetry.Tried(r.Serial, now, s.destroyCAKey(ctx, r.Role, r.Serial, r.KeyRef))
				}
			}
		}
	}
	s.caDestroyRetry.Keep(pending)
	s.sweepDrafts(ctx, now)
	if s.rootSteps(ctx, rows, now) {
		// The steps a root rotation needed came first; the rest at the
		// next tick, or when the window of what they prepared ends.
		if end := now.Add(s.caPublishWindow()); wake.IsZero() || end.Before(wake) {
			wake = end
		}
		return wake, nil
	}
	rs := s.ca.Roots()
	for _, role := range caRoles {
		a := active[string(role)]
		if a == nil {
			continue
		}
		p, hasPrepared := prepared[string(role)]
		switch {
		case hasPrepared && !now.Before(s.successorActivates(a)) && !now.Before(p.CreatedAt.Add(s.caPublishWindow())):
			// A successor an operator prepared late is still published
			// for caPublishWindow before it signs.
			if s.discardKeyless(ctx, p) {
				continue
			}
			if !p.NotAfter.After(now) {
				// Expired before it was activated (the authority was
				// stopped past it, or its store restored from a backup
				// that held it): activated, the role would issue
				// nothing until the next look prepared another.
				s.endIntermediate(ctx, "ca.discard", p.Role, p.Serial, fmt.Sprintf("it expired at %s before it was activated (the authority was stopped, or its store restored from a backup, past it): "+
					"activated, it would sign nothing, so it is discarded and the leader prepares a successor at its next look", p.NotAfter.UTC().Format(time.RFC3339)),
					s.store.DiscardCACert)
				continue
			}
			const why = "two thirds of the active intermediate's life have passed"
			link := s.caStepLink("ca.activate", string(role), p.Serial, why)
			s.caChange(ctx, "ca.activate", string(role), p.Serial, why, link, s.store.ActivateCACert(ctx, string(role), p.Serial, link.Build))
		case !hasPrepared && rs.SigningKey == nil && !now.Before(s.successorDue(a).Add(-caWarnAhead)):
			s.warnNoRootKey(role, a, now)
		case !hasPrepared && !now.Before(s.successorDue(a)):
			const why = "half of the active intermediate's life has passed"
			var link *audit.Link
			row, err := s.inter.prepareUnder(ctx, role, rs.Signing, rs.SigningKey, s.caIntermediateTTL(), func(row store.CACert) *audit.Link {
				link = s.caStepLink("ca.prepare", string(role), row.Serial, why)
				return link
			})
			s.caChange(ctx, "ca.prepare", string(role), row.Serial, why, link, err)
		}
	}
	return wake, nil
}

// successorDue is when the successor of the active intermediate a is
// prepared: at half its life. Its life runs from its issuance (NotBefore
// is backdated for clock skew); one made to live longer than
// ca.intermediate_ttl (muster init's year, or a setting since lowered) is
// rotated on the setting's schedule.
func (s *Server) successorDue(a *x509.Certificate) time.Time {
	issued := a.NotBefore.Add(ca.Backdate)
	return issued.Add(min(a.NotAfter.Sub(issued), s.caIntermediateTTL()) / 2)
}

// successorActivates is when a's successor is activated: at two thirds
// of a's life.
func (s *Server) successorActivates(a *x509.Certificate) time.Time {
	issued := a.NotBefore.Add(ca.Backdate)
	return issued.Add(min(a.NotAfter.Sub(issued), s.caIntermediateTTL()) * 2 / 3)
}

// rotationBlocked is the warning, naming the way out, that role's
// successor is due within caWarnAhead (or overdue) and cannot be prepared
// because the root key is absent and none is prepared; "" when it is not.
func (s *Server) rotationBlocked(role ca.Role, active *x509.Certificate, hasPrepared bool, now time.Time) string {
	due := s.successorDue(active)
	if hasPrepared || s.ca.Roots().SigningKey != nil || now.Before(due.Add(-caWarnAhead)) {
		return ""
	}
	when := "is due " + due.UTC().Format(time.RFC3339)
	if !now.Before(due) {
		when = "was due " + due.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("the %s intermediate (serial %s) expires %s; its successor %s but the root key is not in the data directory, so none is prepared: run `muster ca rotate %s --root-key FILE` where the root key is (docs/ca-lifecycle.md)",
		role, active.SerialNumber.Text(16), active.NotAfter.UTC().Format(time.RFC3339), when, role)
}

// caWarnings are the rotation warnings of every role as this replica
// holds its intermediates, for muster status and the metric.
func (s *Server) caWarnings(now time.Time) map[ca.Role]string {
	out := map[ca.Role]string{}
	live := s.ca.CurrentIntermediates()
	if live == nil {
		return out
	}
	for _, role := range caRoles {
		if a := live.Active[role]; a != nil {
			if w := s.rotationBlocked(role, a.Cert, len(live.Prepared[role]) > 0, now); w != "" {
				out[role] = w
			}
		}
	}
	return out
}

// caWarningList is warn in the order of caRoles.
func caWarningList(warn map[ca.Role]string) []string {
	var out []string
	for _, role := range caRoles {
		if w := warn[role]; w != "" {
			out = append(out, w)
		}
	}
	return out
}

// warnNoRootKey logs, at most once a day per role, that role's successor
// is due soon (or overdue) and cannot be prepared: the active intermediate
// runs to its expiry, after which its role issues nothing.
func (s *Server) warnNoRootKey(role ca.Role, active *x509.Certificate, now time.Time) {
	if last, ok := s.caNoRootKey.Load(role); ok && now.Sub(last.(time.Time)) < caWarnEvery {
		return
	}
	s.caNoRootKey.Store(role, now)
	s.log.Warn("a CA intermediate needs a successor prepared with the offline root key: "+s.rotationBlocked(role, active, false, now),
		"role", role, "serial", active.SerialNumber.Text(16), "expires", active.NotAfter.UTC(), "due", s.successorDue(active).UTC())
}

// caStepLink is the record of a CA step the authority takes on its own
// clock, for the store write that makes it.
func (s *Server) caStepLink(action, role, serial, why string) *audit.Link {
	return newLink(s.audit, audit.Event{Actor: "authority", Action: action, Target: role + "/" + serial, Result: audit.ResultOK, Reason: why})
}

// linker makes the record a store write appends with the change it
// records (audit.Logger).
type linker interface {
	Builder(e audit.Event) (*audit.Link, error)
}

// CAAuditor is the audit log of an offline CA command (muster ca rotate
// --offline, muster ca migrate-custody): its refusals are recorded on
// their own, its steps with the store writes that make them
// (audit.Logger).
type CAAuditor interface {
	Record(ctx context.Context, e audit.Event) (store.AuditRecord, error)
	linker
	Appended(k *audit.Link)
}

// newLink is l's link for e, for a store write that appends it with the
// change it records; one the log refuses to build (an event it finds
// invalid) fails that write, so nothing is written.
func newLink(l linker, e audit.Event) *audit.Link {
	k, err := l.Builder(e)
	if err != nil {
		return audit.NewLink(e, func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, err })
	}
	return k
}

// caChange logs and audits a rotation step; a conflict means another
// replica took it first, and is neither.
// A step written with its record (link, appended in the step's store
// write) is noted as appended; one without (link nil: a draft's key
// claimed and destroyed, which is no intermediate's state) is recorded
// now.
func (s *Server) caChange(ctx context.Context, action, role, serial, why string, link *audit.Link, err error) {
	switch {
	case errors.Is(err, store.ErrConflict):
		return
	case s.outage.fail(err):
		return // logged once for the whole outage; the step is taken again at the next tick
	case err != nil:
		// The step is tried again at every tick (5 s): a failure that
		// lasts (a PKCS#11 token away) is logged and audited once, and
		// again only when it changes, not 4 records per tick.
		if !s.caStepFails.changed(action+" "+role, err.Error()) {
			return
		}
		s.log.Error("CA rotation step failed", "action", action, "role", role, "err", err)
		_ = s.recordAudit(ctx, audit.Event{Actor: "authority", Action: action, Target: role, Result: audit.ResultError, Reason: err.Error()})
		return
	}
	s.caStepFails.changed(action+" "+role, "")
	s.log.Info("CA intermediate rotated a step", "action", action, "role", role, "serial", serial, "reason", why)
	if link != nil {
		s.audit.Appended(link)
		return
	}
	_ = s.recordAudit(ctx, audit.Event{Actor: "authority", Action: action, Target: role + "/" + serial, Result: audit.ResultOK, Reason: why})
}

// DefaultCADraftTTL is ca.draft_ttl's default: how long a draft (muster ca
// rotate ROLE --root-key FILE) waits for its signed certificate before the
// leader destroys its key. The CLI sends the certificate back within the
// same command, so the draft needs to outlive only that command; the
// bounds keep a key in custody no longer than a day, and above a few
// seconds, which tests use.
const (
	DefaultCADraftTTL = time.Hour
	MinCADraftTTL     = 5 * time.Second
	MaxCADraftTTL     = 24 * time.Hour
)

// caDraftSweep is how often the leader looks for expired drafts, at most:
// under a ca.draft_ttl shorter than twice it, twice a ca.draft_ttl.
const caDraftSweep = time.Minute

// caDraftTTL is ca.draft_ttl in force.
func (s *Server) caDraftTTL() time.Duration {
	return s.shared().CADraftTTL
}

// caDraftExpired says why a draft's key was or is destroyed, naming the
// setting and its value.
func (s *Server) caDraftExpired() string {
	return "a draft whose certificate signed with the offline root key never came back within ca.draft_ttl (" + s.caDraftTTL().String() + ")"
}

// sweepDrafts destroys the keys of drafts whose signed certificate never
// came back within ca.draft_ttl (the CLI stopped between its two calls),
// looking at most every caDraftSweep: each is claimed first, one conditional write, so one
// replica destroys it, and a prepare arriving later is told to draft again.
func (s *Server) sweepDrafts(ctx context.Context, now time.Time) {
	if last, ok := s.caDraftSwept.Load().(time.Time); ok && now.Sub(last) < min(caDraftSweep, s.caDraftTTL()/2) && !now.Before(last) {
		return
	}
	s.caDraftSwept.Store(now)
	drafts, err := s.store.ListCADrafts(ctx)
	if err != nil {
		if !s.outage.fail(err) {
			s.log.Error("listing the CA drafts failed", "err", err)
		}
		return
	}
	for _, d := range drafts {
		if now.Sub(d.CreatedAt) < s.caDraftTTL() {
			continue
		}
		s.endDraft(ctx, d.Role, d.Serial, custody.Where(d.KeyRef))
	}
}

// endIntermediate retires (end: RetireCACert) or discards (DiscardCACert)
// an intermediate, in one conditional write with the step's audit record,
// and destroys its key in custody: only the replica whose write won gets
// the reference, and a step whose record cannot be written is not taken,
// so its key is not destroyed. The reference stays on the retired row
// until the key is destroyed; then it is emptied in a second conditional
// write with its ca.destroy_key record (destroyCAKey), and a destruction
// that fails, or never happens (the replica stopped in between), is
// taken again by the leader's next clock pass.
func (s *Server) endIntermediate(ctx context.Context, action, role, serial, why string, end func(ctx context.Context, role, serial string, audit func(store.AuditHead) (store.AuditRecord, error)) ([]byte, error)) {
	link := s.caStepLink(action, role, serial, why+"; "+destroyedNext)
	ref, err := end(ctx, role, serial, link.Build)
	s.caChange(ctx, action, role, serial, why, link, err)
	if err == nil && ref != nil {
		s.destroyCAKey(ctx, role, serial, ref)
	}
}

// preparedKeyGone says why the prepared intermediate p cannot sign, if
// the token answers that its key is not there (a token restored from a
// copy older than the prepare, the object deleted by hand) or is not the
// key the store names; nil otherwise, a sealed key, or a token that does
// not answer (its own readiness reports that, and the active key is in
// the same token). A replica opens a prepared key when it reads it and
// keeps it open, so only a lookup now tells: activated, the role would
// sign with a key that is not there, every join and renewal refused,
// while the active one still signs.
func (s *Server) preparedKeyGone(ctx context.Context, p store.CACert) error {
	if !custody.IsPKCS11Ref(p.KeyRef) {
		return nil
	}
	cert, err := x509.ParseCertificate(p.CertDER)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, caLoadTimeout)
	defer cancel()
	if _, err := s.inter.custody.Signer(lctx, keyName(p.Role, p.Serial), custody.Key{Public: cert.PublicKey, Ref: p.KeyRef}); errors.Is(err, custody.ErrKey) {
		return err
	}
	return nil
}

// discardKeyless discards the prepared intermediate p instead of
// activating it when its key is gone from the token (preparedKeyGone),
// and reports whether it did: the active one signs on, and the leader
// prepares a successor in the token at its next look, as it is due.
func (s *Server) discardKeyless(ctx context.Context, p store.CACert) bool {
	err := s.preparedKeyGone(ctx, p)
	if err == nil {
		return false
	}
	s.endIntermediate(ctx, "ca.discard", p.Role, p.Serial, fmt.Sprintf("its key (%s) cannot sign: %v; activated, it would leave the role with no key that signs, "+
		"so it is discarded and the active one signs on; the leader prepares a successor in the token at its next look", custody.Where(p.KeyRef), err),
		s.store.DiscardCACert)
	return true
}

// destroyedNext is what a step that ends an intermediate says of its key.
const destroyedNext = "its key, if it holds one, is destroyed next, and its reference then leaves the store with a ca.destroy_key record (until then ca status shows it as destroy pending)"

// endDraft discards the draft role/serial, whose signed certificate
// never came back within ca.draft_ttl: its claim carries the ca.discard
// record in the same conditional write, so one replica (or a prepare
// that came too late) gets its key and destroys it, and a claim whose
// record cannot be written leaves the draft, and its key, for the next
// sweep. A draft has no row left to hold its reference until the key is
// destroyed: the record names the key, and how its destruction went is
// recorded after it (ca.destroy_key).
func (s *Server) endDraft(ctx context.Context, role, serial, where string) {
	why := s.caDraftExpired()
	// A replica that stops between the claim and the destruction leaves
	// the key with no row to name it: the claim's record names it, and
	// the command that deletes it.
	byHand := s.deleteByHand(ctx, where)
	link := s.caStepLink("ca.discard", role, serial, why+"; its key ("+where+") is destroyed next (ca.destroy_key); with no ca.destroy_key after this record, "+byHand)
	d, err := s.store.ClaimCADraft(ctx, serial, link.Build)
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("%w: claimed first by a prepare or another replica", store.ErrConflict)
	}
	s.caChange(ctx, "ca.discard", role, serial, why, link, err)
	if err != nil || d.KeyRef == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), caStepTimeout)
	defer cancel()
	outcome, derr := destroyKey(dctx, s.inter.custody, role, serial, d.KeyRef)
	e := audit.Event{Actor: "authority", Action: "ca.destroy_key", Target: role + "/" + serial, Result: audit.ResultOK, Reason: outcome}
	if derr != nil {
		s.log.Error("destroying a CA draft's key failed; delete it from the token by hand",
			"role", role, "serial", serial, "key", custody.Where(d.KeyRef), "err", derr, "command", byHand)
		e.Result, e.Reason = audit.ResultError, outcome+", "+byHand
	}
	_ = s.recordAudit(ctx, e)
}

// deleteByHand says how to delete the token objects of the key where
// (custody.Where of its reference) by hand: the pkcs11-tool commands
// (custody.DeleteCommands), with the module of the token this replica
// opened, else the one the store's key custody records. A sealed key has
// nothing outside the store.
func (s *Server) deleteByHand(ctx context.Context, where string) string {
	return custody.DeleteByHand(s.tokenModule(ctx), []byte(where))
}

// tokenModule is the PKCS#11 library of the authority's token: the one
// this replica opened it with, else the one the store records (muster ca
// migrate-custody), else "".
func (s *Server) tokenModule(ctx context.Context) string {
	if m := s.token.Module(); m != "" {
		return m
	}
	if c, err := s.store.GetKeyCustody(ctx); err == nil {
		return c.Module
	}
	return ""
}

// destroyCAKey destroys the key of a retired intermediate and empties its
// reference with its ca.destroy_key record (destroyRetiredKey). A failure
// is logged and recorded once, until its reason changes; the reference
// stays, and the leader's clock tries again (caDestroyRetry). It returns
// the failure, if any.
func (s *Server) destroyCAKey(ctx context.Context, role, serial string, ref []byte) error {
	outcome, err := destroyRetiredKey(ctx, s.store, s.inter.custody, s.audit, "authority", role, serial, ref)
	step := "ca.destroy_key " + role + "/" + serial
	switch {
	case err == nil:
		s.caStepFails.changed(step, "")
		return nil
	case s.outage.fail(err):
		return err
	case !s.caStepFails.changed(step, err.Error()):
		return err
	}
	s.log.Error("destroying a retired CA intermediate's key failed; the leader tries again, less often while it keeps failing (at least every "+caDestroyMaxWait.String()+")",
		"role", role, "serial", serial, "key", custody.Where(ref), "err", err)
	_ = s.recordAudit(ctx, audit.Event{Actor: "authority", Action: "ca.destroy_key", Target: role + "/" + serial, Result: audit.ResultError,
		Reason: outcome + "; its reference stays in the store (ca status: destroy pending) and the leader tries again, at least every " + caDestroyMaxWait.String() + " (this is recorded again only if the failure changes)"})
	return err
}

// The leader's clock tries a failed destruction of a retired
// intermediate's key again caDestroyFirstWait after the failure, then
// twice as long after each further failure, up to caDestroyMaxWait: a
// token away for a day costs a few hundred tries, not seventeen thousand.
const (
	caDestroyFirstWait = caTick
	caDestroyMaxWait   = 5 * time.Minute
)

// destroyRetiredKey destroys the key ref of the retired intermediate
// role/serial in c, then empties its reference in st with its
// ca.destroy_key record, built by l, in one conditional write: the
// record is written only once the key is gone, and a key that could not
// be destroyed keeps its reference for the next try. Of two callers the
// second finds the object gone and the reference emptied (ErrConflict,
// no record: the first wrote it). It returns how the destruction went.
func destroyRetiredKey(ctx context.Context, st store.Store, c custody.Custody, l CAAuditor, actor, role, serial string, ref []byte) (string, error) {
	// The step committed: the key is destroyed now, not with what is
	// left of the step's deadline.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), caStepTimeout)
	defer cancel()
	outcome, err := destroyKey(dctx, c, role, serial, ref)
	if err != nil {
		return outcome, err
	}
	link := newLink(l, audit.Event{Actor: actor, Action: "ca.destroy_key", Target: role + "/" + serial, Result: audit.ResultOK, Reason: outcome})
	err = st.DropCAKey(dctx, serial, ref, link.Build)
	switch {
	case errors.Is(err, store.ErrConflict):
		return outcome, nil
	case err != nil:
		return outcome, fmt.Errorf("%s, but its reference could not leave the store: %w", outcome, err)
	}
	l.Appended(link)
	return outcome, nil
}

// destroyKey destroys the key ref of role/serial in c and says how it
// went, for the audit record.
func destroyKey(ctx context.Context, c custody.Custody, role, serial string, ref []byte) (string, error) {
	where := custody.Where(ref)
	found, err := custody.DestroyFound(ctx, c, keyName(role, serial), custody.Key{Ref: ref})
	switch {
	case err != nil:
		return "destroying its key (" + where + ") failed: " + err.Error(), err
	case !found:
		// Lost with the token, or deleted by hand: saying it was
		// destroyed now would hide that it went earlier.
		return "its key (" + where + ") was already gone from the token, nothing to destroy", nil
	}
	return "its key (" + where + ") destroyed", nil
}

// pokeCAClock asks the leader's CA clock, if it runs on this replica, to
// take its steps now rather than at the next tick (a root rotation phase
// changed). It never blocks; on another replica the next tick does it.
func (s *Server) pokeCAClock() {
	select {
	case s.caPoke <- struct{}{}:
	default:
	}
}

// stepFailures are the CA steps whose last try failed, with the error,
// so a failure repeated at every tick is reported once. Safe for
// concurrent use; the zero value is ready.
type stepFailures struct {
	mu   sync.Mutex
	last map[string]string
}

// changed records why (empty: it succeeded) as step's last outcome and
// reports whether it differs from the one before.
func (f *stepFailures) changed(step, why string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last[step] == why {
		return false
	}
	if why == "" {
		delete(f.last, step)
		return true
	}
	if f.last == nil {
		f.last = map[string]string{}
	}
	f.last[step] = why
	return true
}
