package authority

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/shellword"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
)

// Moving an existing authority's keys into a PKCS#11 token (muster ca
// migrate-custody, docs/hsm.md "Moving an existing authority into an
// HSM"). A token generates its keys inside and cannot take one made
// elsewhere, so nothing is copied: the token's URI is recorded in the
// store (every replica then needs the token to start), and new keys are
// made in it through the rotation machinery — a prepared successor per
// intermediate role, published for caPublishWindow before it may be
// activated, and a staged task signer. The sealed keys they replace go
// as rotation retires them. It runs offline, on the machine that holds
// the storage key, against the store every replica shares: each write is
// the store's own conditional write, as from any replica, so a running
// authority is left alone and a second run finds what the first did.

// CustodyMigration is what MigrateCustody needs.
type CustodyMigration struct {
	Store      store.Store
	CA         *ca.Hierarchy // the data directory's root (and its key, if there)
	StorageKey seal.StorageKey
	Token      *custody.Token
	// URI and Module are recorded in the store: the token's pkcs11: URI
	// (no PIN) and the module that opened it here.
	URI, Module string
	Audit       CAAuditor
	AuthorityID string
	Actor       string
	// IntermediateTTL is the prepared successors' lifetime
	// (ca.intermediate_ttl).
	IntermediateTTL time.Duration
	// SignerMinLead is signer.min_lead_time; SignerEffectiveIn and
	// SignerGrace the staged signer's times (at least the lead time).
	SignerMinLead, SignerEffectiveIn, SignerGrace time.Duration
	// DataDir is the data directory as the operator named it: the
	// online commands the steps name (muster signer activate, …) carry
	// it as --data, so that pasted on this host they reach this
	// authority with its operator identity, not ./muster-data's.
	DataDir string
}

// online is the online command cmd as a step names it: in backquotes,
// with --data naming the migration's data directory, shell-quoted.
func (m CustodyMigration) online(cmd string) string {
	if m.DataDir == "" {
		return "`" + cmd + "`"
	}
	return "`" + cmd + " --data " + shellword.Quote(m.DataDir) + "`"
}

// MigrationStep is what the migration did, or found done, for one key.
type MigrationStep struct {
	// Key is "ca/ROLE", "signer" or "join-state".
	Key string `json:"key"`
	// Done: "prepared", "staged" (this run), "already" (an earlier run, or
	// the key is in the token already), "waiting" (nothing this run can
	// do; Next says what will), "skipped" (Next says what to do).
	Done string `json:"done"`
	// Serial is the intermediate's serial, Version the signer's.
	Serial  string `json:"serial,omitempty"`
	Version string `json:"version,omitempty"`
	// Where is the key's token object.
	Where string `json:"key_custody,omitempty"`
	// Next is the operator's next step for this key.
	Next string `json:"next"`
}

// CustodyMigrationResult is MigrateCustody's outcome.
type CustodyMigrationResult struct {
	URI    string `json:"pkcs11_uri"`
	Module string `json:"pkcs11_module"`
	// AlreadyRecorded: an earlier run recorded the token.
	AlreadyRecorded bool            `json:"already_recorded"`
	Steps           []MigrationStep `json:"steps"`
	// RootRotation is the phase of a root rotation under way ("" when
	// none is): its new root's key is where that rotation made it, and
	// another cannot start until it reaches standby.
	RootRotation string `json:"root_rotation,omitempty"`
	// RootKey says where the newest root's key is, for a rotation
	// under way: "sealed" or its token object.
	RootKey string `json:"root_key_custody,omitempty"`
}

// ErrOtherToken refuses a migration to a token when the store records
// another one.
var ErrOtherToken = errors.New("the store records another PKCS#11 token")

// MigrateCustody moves the authority's keys into m.Token (see above). The
// token is tested first (a key of each algorithm made, used and destroyed
// again) and nothing is written if that fails. Each write carries its own
// audit record (the token's, ca.migrate_custody; each key's step); a
// second ca.migrate_custody, recorded after, sums up the run (what
// moved, what was found done) and changes nothing, and a refusal is
// recorded too.
func MigrateCustody(ctx context.Context, m CustodyMigration) (CustodyMigrationResult, error) {
	res, err := migrateCustody(ctx, m)
	e := audit.Event{Actor: m.Actor, Action: "ca.migrate_custody", Target: m.URI, Result: audit.ResultOK}
	if err != nil {
		e.Result, e.Reason = audit.ResultError, err.Error()
		if errors.Is(err, ErrOtherToken) {
			e.Result = audit.ResultDenied
		}
	} else {
		var parts []string
		for _, s := range res.Steps {
			id := s.Serial + s.Version
			if id != "" {
				id = " " + id
			}
			parts = append(parts, s.Key+": "+s.Done+id)
		}
		rec := "summary: token recorded in the store by this run"
		if res.AlreadyRecorded {
			rec = "summary: token already recorded"
		}
		e.Reason = rec + "; " + strings.Join(parts, "; ")
	}
	if _, aerr := m.Audit.Record(context.WithoutCancel(ctx), e); aerr != nil && err == nil {
		err = fmt.Errorf("the migration's steps are written, each with its audit record, but the summary record is not: %w", aerr)
	}
	return res, err
}

func migrateCustody(ctx context.Context, m CustodyMigration) (CustodyMigrationResult, error) {
	res := CustodyMigrationResult{URI: m.URI, Module: m.Module}
	if m.Token == nil {
		return res, errors.New("no PKCS#11 token to move the keys into")
	}
	if err := custody.SelfTest(ctx, m.Token.For("muster-")); err != nil {
		return res, fmt.Errorf("the token %s does not work for muster's keys, nothing changed: %w", m.URI, err)
	}
	// The roots are read before anything is written: a root rotation
	// whose stored root does not open here fails the run untouched.
	caCustody, err := CACustody(m.StorageKey, m.Token)
	if err != nil {
		return res, err
	}
	rot, err := m.Store.GetRootRotation(ctx)
	if err != nil {
		return res, err
	}
	roots, err := openRootState(ctx, caCustody, m.CA, rot)
	if errors.Is(err, custody.ErrKeyMissing) {
		return res, fmt.Errorf("reading the root rotation, nothing changed: %w; %s", err, rootKeyWayOut)
	}
	if err != nil {
		return res, fmt.Errorf("reading the root rotation: %w", err)
	}
	set := roots.set()
	if rot.Phase != store.RootPhaseNone && rot.Phase != "" {
		res.RootRotation, res.RootKey = rot.Phase, custody.Where(rot.NewKeyRef)
	}
	if prev, err := m.Store.GetKeyCustody(ctx); err == nil {
		res.AlreadyRecorded = true
		if prev.URI != m.URI {
			return res, fmt.Errorf("%w (%s, recorded %s) than %s; nothing changed: run it with --custody '%s'",
				ErrOtherToken, prev.URI, prev.RecordedAt.UTC().Format(time.RFC3339), m.URI, prev.URI)
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return res, err
	}
	// Recorded with its own record, in the same write: from here every
	// replica needs the token to start, whether or not a step follows.
	link := newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.migrate_custody", Target: m.URI, Result: audit.ResultOK,
		Reason: "token recorded in the store (module " + m.Module + "): every replica needs it to start from now; its keys are made in it next, each step recorded on its own (ca.discard, ca.prepare, node_task_signer.stage)"})
	// The store builds the record only when it writes the token: not
	// when a run naming the same token recorded it meanwhile.
	wrote := false
	build := func(head store.AuditHead) (store.AuditRecord, error) {
		r, err := link.Build(head)
		wrote = err == nil
		return r, err
	}
	if _, err := m.Store.RecordKeyCustody(ctx, store.KeyCustody{URI: m.URI, Module: m.Module}, build); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return res, fmt.Errorf("%w (recorded meanwhile) than %s; nothing changed", ErrOtherToken, m.URI)
		}
		return res, fmt.Errorf("recording the token in the store, nothing changed: %w", err)
	}
	m.Audit.Appended(link)
	res.AlreadyRecorded = res.AlreadyRecorded || !wrote
	for _, role := range caRoles {
		step, err := migrateIntermediate(ctx, m, caCustody, set, role)
		if err != nil {
			return res, fmt.Errorf("the %s intermediate: %w", role, err)
		}
		res.Steps = append(res.Steps, step)
	}
	step, err := migrateSigner(ctx, m)
	if err != nil {
		return res, fmt.Errorf("the task signer: %w", err)
	}
	res.Steps = append(res.Steps, step, MigrationStep{Key: "join-state", Done: "waiting",
		Next: "made in the token by the first bound-keypair join after each replica restarts with the token; the sealed one stays to verify the join states agents hold"})
	return res, nil
}

// migrateIntermediate prepares role's successor in the token, unless one
// is prepared or active there already. A sealed prepared successor (the
// leader's clock came first) is discarded for it: it signed nothing.
func migrateIntermediate(ctx context.Context, m CustodyMigration, c custody.Custody, set *ca.RootSet, role ca.Role) (MigrationStep, error) {
	step := MigrationStep{Key: "ca/" + string(role)}
	activate := fmt.Sprintf("the leader activates it at two thirds of the active one's life, or run %s once it has been published for %s (every replica restarted with the token)", m.online("muster ca rotate "+string(role)+" --activate"), caPublishWindow)
	for attempt := 0; ; attempt++ {
		rows, err := m.Store.ListCACerts(ctx)
		if err != nil {
			return step, err
		}
		prepared, active := preparedOf(rows, role)
		switch {
		case active != nil && custody.IsPKCS11Ref(active.KeyRef):
			step.Done, step.Serial, step.Where = "already", active.Serial, custody.Where(active.KeyRef)
			step.Next = "active in the token"
			return step, nil
		case prepared != nil && custody.IsPKCS11Ref(prepared.KeyRef):
			step.Done, step.Serial, step.Where, step.Next = "already", prepared.Serial, custody.Where(prepared.KeyRef), "prepared in the token: "+activate
			return step, nil
		case active == nil:
			step.Done, step.Next = "skipped", "the store has no active "+string(role)+" intermediate yet: start the authority once, then run this again"
			return step, nil
		case set.SigningKey == nil:
			step.Done = "skipped"
			step.Next = fmt.Sprintf("the root key is not here: once every replica runs with the token, %s prepares it with its key in the token", m.online("muster ca rotate "+string(role)+" --root-key FILE"))
			return step, nil
		}
		if attempt == 3 {
			return step, errors.New("the intermediates kept changing under the migration (the leader's clock or an operator); run it again")
		}
		if prepared != nil {
			link := newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.discard", Target: string(role) + "/" + prepared.Serial,
				Result: audit.ResultOK, Reason: "a sealed successor that signed nothing, replaced by one in the PKCS#11 token (muster ca migrate-custody)"})
			ref, err := m.Store.DiscardCACert(ctx, string(role), prepared.Serial, link.Build)
			if errors.Is(err, store.ErrConflict) {
				continue // activated or replaced meanwhile: read again
			}
			if err != nil {
				return step, err
			}
			m.Audit.Appended(link)
			// A sealed key: its reference leaves the store with its
			// ca.destroy_key record; should that fail, the leader's
			// clock takes it again.
			_, _ = destroyRetiredKey(ctx, m.Store, c, m.Audit, m.Actor, string(role), prepared.Serial, ref)
		}
		var link *audit.Link
		row, err := prepareIntermediate(ctx, m.Store, c, m.CA, role, set.Signing, set.SigningKey, m.IntermediateTTL, func(row store.CACert) *audit.Link {
			link = newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.prepare", Target: string(role) + "/" + row.Serial,
				Result: audit.ResultOK, Reason: "its key generated in the PKCS#11 token (muster ca migrate-custody)"})
			return link
		})
		if errors.Is(err, store.ErrConflict) {
			continue // the leader prepared one meanwhile: read again
		}
		if err != nil {
			return step, err
		}
		m.Audit.Appended(link)
		step.Done, step.Serial, step.Where, step.Next = "prepared", row.Serial, custody.Where(row.KeyRef), activate
		return step, nil
	}
}

// migrateSigner stages a task signer whose key is in the token, unless
// the active or staged one is there already. A sealed staged signer is
// left alone: the operator decides (activate it, or roll it back) and
// runs the migration again.
func migrateSigner(ctx context.Context, m CustodyMigration) (MigrationStep, error) {
	step := MigrationStep{Key: "signer"}
	sc, err := SignerCustody(m.StorageKey, m.Token)
	if err != nil {
		return step, err
	}
	k := signer.NewKeeper(m.Store, sc, m.Audit, m.AuthorityID, m.SignerMinLead)
	snap, err := k.Load(ctx)
	if err != nil {
		return step, err
	}
	var active, staged *signer.Signer
	for i := range snap.Signers {
		switch snap.Signers[i].State {
		case signer.Active:
			active = &snap.Signers[i]
		case signer.Staged:
			staged = &snap.Signers[i]
		}
	}
	inToken := func(s *signer.Signer) bool {
		return s != nil && custody.IsPKCS11Ref([]byte(snap.KeyCustody(s.VersionID)))
	}
	switch {
	case inToken(active):
		step.Done, step.Version, step.Where, step.Next = "already", active.VersionID, snap.KeyCustody(active.VersionID), "active in the token"
		return step, nil
	case inToken(staged):
		step.Done, step.Version, step.Where = "already", staged.VersionID, snap.KeyCustody(staged.VersionID)
		step.Next = "staged in the token: it activates at " + staged.EffectiveAt.UTC().Format(time.RFC3339) + ", or run " + m.online("muster signer activate") + " (every replica restarted with the token)"
		return step, nil
	case staged != nil:
		step.Done, step.Version = "skipped", staged.VersionID
		step.Next = "signer " + staged.VersionID + " (sealed) is staged: let it activate (or " + m.online("muster signer activate") + "), or " + m.online("muster signer rollback") + " it, then run this again to stage one in the token"
		return step, nil
	}
	eff := max(m.SignerEffectiveIn, k.MinLeadTime())
	res, err := k.Stage(ctx, signer.Actor{Name: m.Actor}, eff, m.SignerGrace)
	if err != nil {
		return step, err
	}
	s, ok := rotationOf(res)
	if !ok {
		return step, errors.New("staging made no staged signer")
	}
	after, err := k.Load(ctx)
	if err != nil {
		return step, err
	}
	step.Done, step.Version, step.Where = "staged", s.VersionID, after.KeyCustody(s.VersionID)
	step.Next = "it activates at " + s.EffectiveAt.UTC().Format(time.RFC3339) + ", or run " + m.online("muster signer activate") + " once every replica runs with the token"
	return step, nil
}

// RollbackCustodyMigration undoes a migration whose token is lost (or
// was the wrong one) before any key in it was put to use: the successors
// prepared in the token are discarded, the signer staged there rolled
// back, and the token's record removed from the store last, so that a
// run cut short is run again. It opens no token (the token may be gone):
// the objects stay in it, to delete by hand. Once a key in the token
// signs (an intermediate or signer activated, a root rotation's root, a
// join-state key), it is refused: what that key signed needs it, and the
// way back is the token's backup (docs/hsm.md).
func RollbackCustodyMigration(ctx context.Context, m CustodyMigration) (CustodyMigrationResult, error) {
	res, cleared, err := rollbackCustody(ctx, m)
	if cleared {
		return res, nil // recorded with the token's record removed
	}
	e := audit.Event{Actor: m.Actor, Action: "ca.migrate_custody", Target: m.URI, Result: audit.ResultOK}
	switch {
	case err != nil:
		e.Result, e.Reason = audit.ResultDenied, "rollback refused: "+err.Error()
	case res.AlreadyRecorded:
		e.Reason = "nothing left to roll back: the token's record was removed from the store meanwhile (another rollback)"
	default:
		e.Reason = "nothing to roll back in the store (it records no token and holds no key in it); authority.json's record of the token, if any, removed"
	}
	if _, aerr := m.Audit.Record(context.WithoutCancel(ctx), e); aerr != nil && err == nil {
		err = fmt.Errorf("rolled back, but its audit record is not written: %w", aerr)
	}
	return res, err
}

// ErrInUse refuses a rollback once a key in the token signs.
var ErrInUse = errors.New("a key in the token is in use")

// rollbackCustody is RollbackCustodyMigration's work; cleared says it
// removed the token's record, with its audit record.
func rollbackCustody(ctx context.Context, m CustodyMigration) (res CustodyMigrationResult, cleared bool, err error) {
	res = CustodyMigrationResult{URI: m.URI}
	rec, err := m.Store.GetKeyCustody(ctx)
	if errors.Is(err, store.ErrNotFound) {
		// Nothing recorded, nothing to undo in the store: the caller then
		// removes the token from authority.json (one that names it over a
		// store restored from before the migration). Not while a key the
		// store knows is in the token (muster init --custody records no
		// migration): that would drop the token those keys need.
		where, err := tokenKeyKnown(ctx, m.Store)
		if err != nil {
			return res, false, err
		}
		if where != "" {
			return res, false, fmt.Errorf("%w: the store records no migration to roll back, but %s is in the token (an authority made with muster init --custody keeps its keys there); nothing changed, authority.json keeps the token", ErrInUse, where)
		}
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	res.Module, res.AlreadyRecorded = rec.Module, true
	if rec.URI != m.URI {
		return res, false, fmt.Errorf("the store records the token %s, not %s; nothing changed", rec.URI, m.URI)
	}
	backup := "restore the token from its backup (docs/hsm.md); nothing changed"
	rows, err := m.Store.ListCACerts(ctx)
	if err != nil {
		return res, false, err
	}
	for _, r := range rows {
		if (r.State == store.CAActive || r.State == store.CARetiring) && custody.IsPKCS11Ref(r.KeyRef) {
			return res, false, fmt.Errorf("%w: the %s intermediate %s in the token has signed certificates (%s): %s", ErrInUse, r.Role, r.Serial, r.State, backup)
		}
	}
	rot, err := m.Store.GetRootRotation(ctx)
	if err != nil {
		return res, false, err
	}
	if custody.IsPKCS11Ref(rot.NewKeyRef) || custody.IsPKCS11Ref(rot.OldKeyRef) {
		return res, false, fmt.Errorf("%w: a root of the root rotation is in the token: %s", ErrInUse, backup)
	}
	jsk, err := m.Store.ListJoinStateKeys(ctx)
	if err != nil {
		return res, false, err
	}
	for _, k := range jsk {
		if custody.IsPKCS11Ref(k.Ciphertext) {
			return res, false, fmt.Errorf("%w: the join-state key %s in the token signed join states agents hold: %s", ErrInUse, k.ID, backup)
		}
	}
	sc, err := SignerCustody(m.StorageKey, nil)
	if err != nil {
		return res, false, err
	}
	// This keeper opens no token: the staged signer's key it leaves there
	// is named with the module the store recorded.
	k := signer.NewKeeper(m.Store, sc, m.Audit, m.AuthorityID, m.SignerMinLead).WithLeftModule(rec.Module)
	snap, err := k.Load(ctx)
	if err != nil {
		return res, false, err
	}
	var staged *signer.Signer
	for i, s := range snap.Signers {
		if !custody.IsPKCS11Ref([]byte(snap.KeyCustody(s.VersionID))) {
			continue
		}
		if s.State != signer.Staged {
			return res, false, fmt.Errorf("%w: the task signer %s in the token is %s: %s", ErrInUse, s.VersionID, s.State, backup)
		}
		staged = &snap.Signers[i]
	}
	for _, r := range rows {
		if r.State != store.CAPrepared || !custody.IsPKCS11Ref(r.KeyRef) {
			continue
		}
		byHand := custody.DeleteByHand(rec.Module, r.KeyRef)
		link := newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.discard", Target: r.Role + "/" + r.Serial, Result: audit.ResultOK,
			Reason: "muster ca migrate-custody --rollback: its key (" + custody.Where(r.KeyRef) + ") is left in the token; if the token comes back, " + byHand})
		ref, err := m.Store.DiscardCACert(ctx, r.Role, r.Serial, link.Build)
		if errors.Is(err, store.ErrConflict) {
			return res, false, fmt.Errorf("the %s intermediate %s changed meanwhile (activated?); run the rollback again to see", r.Role, r.Serial)
		}
		if err != nil {
			return res, false, err
		}
		m.Audit.Appended(link)
		// No replica will open the token to destroy it: the reference
		// goes now, with its record, and the object is left.
		drop := newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.destroy_key", Target: r.Role + "/" + r.Serial, Result: audit.ResultOK,
			Reason: "its key (" + custody.Where(ref) + ") is in a PKCS#11 token this authority no longer opens: its reference is dropped; if the token comes back, " + byHand})
		if err := m.Store.DropCAKey(ctx, r.Serial, ref, drop.Build); err != nil && !errors.Is(err, store.ErrConflict) {
			return res, false, fmt.Errorf("dropping the %s intermediate %s's key reference: %w; run the rollback again", r.Role, r.Serial, err)
		} else if err == nil {
			m.Audit.Appended(drop)
		}
		res.Steps = append(res.Steps, MigrationStep{Key: "ca/" + r.Role, Done: "discarded", Serial: r.Serial, Where: custody.Where(r.KeyRef),
			Next: "its token object is left: if the token comes back, " + byHand})
	}
	if staged != nil {
		if _, err := k.Rollback(ctx, signer.Actor{Name: m.Actor}); err != nil {
			return res, false, fmt.Errorf("rolling back the staged signer %s in the token: %w", staged.VersionID, err)
		}
		res.Steps = append(res.Steps, MigrationStep{Key: "signer", Done: "rolled back", Version: staged.VersionID, Where: snap.KeyCustody(staged.VersionID),
			Next: "the sealed active signer stays; its token object is left: if the token comes back, " + custody.DeleteByHand(rec.Module, []byte(snap.KeyCustody(staged.VersionID)))})
	}
	// Last, with the run's record: a run cut short before it leaves the
	// token recorded, to be run again.
	var parts []string
	for _, s := range res.Steps {
		parts = append(parts, s.Key+": "+s.Done+" "+s.Serial+s.Version)
	}
	link := newLink(m.Audit, audit.Event{Actor: m.Actor, Action: "ca.migrate_custody", Target: m.URI, Result: audit.ResultOK,
		Reason: "rolled back: the token's record removed from the store; " + strings.Join(parts, "; ")})
	err = m.Store.ClearKeyCustody(ctx, m.URI, link.Build)
	if errors.Is(err, store.ErrNotFound) {
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	m.Audit.Appended(link)
	return res, true, nil
}

// tokenKeyKnown names a key the store still uses that is a token object
// (an intermediate not retired, a root of the root rotation, a join-state
// key, a task signer staged, active or in grace; a signer rolled back or
// retired verifies nothing); "" when there is none.
func tokenKeyKnown(ctx context.Context, st store.Store) (string, error) {
	rows, err := st.ListCACerts(ctx)
	if err != nil {
		return "", err
	}
	for _, r := range rows {
		if r.State != store.CARetired && custody.IsPKCS11Ref(r.KeyRef) {
			return "the " + r.Role + " intermediate " + r.Serial + " (" + r.State + ")", nil
		}
	}
	rot, err := st.GetRootRotation(ctx)
	if err != nil {
		return "", err
	}
	if custody.IsPKCS11Ref(rot.NewKeyRef) || custody.IsPKCS11Ref(rot.OldKeyRef) {
		return "a root of the root rotation", nil
	}
	jsk, err := st.ListJoinStateKeys(ctx)
	if err != nil {
		return "", err
	}
	for _, k := range jsk {
		if custody.IsPKCS11Ref(k.Ciphertext) {
			return "the join-state key " + k.ID, nil
		}
	}
	signers, _, err := st.ListSigners(ctx)
	if err != nil {
		return "", err
	}
	for _, s := range signers {
		if s.State != store.SignerRetired && s.State != store.SignerRevoked && custody.IsPKCS11Ref(s.KeyRef) {
			return "the task signer " + s.VersionID + " (" + s.State + ")", nil
		}
	}
	return "", nil
}
